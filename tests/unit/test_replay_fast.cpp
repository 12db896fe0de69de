// The kernels of replay's fast forward pass against their plain references, bit for bit:
// portable::exp_doubles against portable::exp, portable::erfs against portable::erf (itself within
// 2 ulp of erf in long double), portable::gemm_packed against a plain loop in the documented
// order, softmax_head_outputs and kernel_head_outputs against the library's attention_outputs
// (awkward sizes N = 1, 2, 50, 197, d = 1, 7, 64; strided inputs; masks, rows that keep no key,
// subsets of rows; every kernel family of the registry).
#include "attnscope/attention.hpp"
#include "attnscope/portable_math.hpp"
#include "attnscope/attention_heads.hpp"
#include "attnscope/error.hpp"
#include "attnscope/feature_map.hpp"
#include "random_inputs.hpp"
#include "variant_specs.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace attnscope {
namespace {

/// The same bits (NaNs of any payload count as equal).
bool same_bits(double a, double b) {
  return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b) || (std::isnan(a) && std::isnan(b));
}

TEST(ReplayFastKernels, ExpDoublesIsExpBitForBit) {
  std::vector<double> xs;
  std::mt19937_64 gen(11);
  std::uniform_real_distribution<double> wide(-760.0, 720.0), near_zero(-40.0, 1.0);
  for (int i = 0; i < 200000; ++i) xs.push_back(wide(gen));
  for (int i = 0; i < 200000; ++i) xs.push_back(near_zero(gen));
  // Every reduction boundary n ln2 / 2 and the range's ends, a few ulps either side; the
  // subnormal results below -708.4 and the 2^1024 split above 709.09.
  for (int k = -2160; k <= 2060; ++k) {
    double x = k * 0.34657359027997264;
    for (int s = 0; s < 4; ++s) x = std::nextafter(x, -HUGE_VAL);
    for (int s = 0; s < 9; ++s, x = std::nextafter(x, HUGE_VAL)) xs.push_back(x);
  }
  for (double edge : {7.09782712893383973096e+02, -7.45133219101941108420e+02, -708.39641853226408, 709.089565712824,
                      -1021.0 * 0.6931471805599453, -1022.0 * 0.6931471805599453, 1023.0 * 0.6931471805599453}) {
    double x = edge;
    for (int s = 0; s < 6; ++s) x = std::nextafter(x, -HUGE_VAL);
    for (int s = 0; s < 13; ++s, x = std::nextafter(x, HUGE_VAL)) xs.push_back(x);
  }
  for (double special : {0.0, -0.0, 1.0, -1.0, 1e-300, -1e-300, 4.9e-324, HUGE_VAL, -HUGE_VAL, 1e308, -1e308,
                         std::numeric_limits<double>::quiet_NaN(), -std::numeric_limits<double>::quiet_NaN()}) {
    xs.push_back(special);
  }
  std::vector<double> got = xs;
  portable::exp_doubles(got.data(), static_cast<Eigen::Index>(got.size()));
  int bad = 0;
  for (std::size_t i = 0; i < xs.size() && bad < 10; ++i) {
    if (!same_bits(got[i], portable::exp(xs[i]))) {
      ++bad;
      ADD_FAILURE() << "exp_doubles(" << xs[i] << ") = " << got[i] << ", exp gives " << portable::exp(xs[i]);
    }
  }
  // With a shift: exp(x - shift), the softmax step.
  got = xs;
  portable::exp_doubles(got.data(), static_cast<Eigen::Index>(got.size()), 3.25);
  for (std::size_t i = 0; i < xs.size() && bad < 20; ++i) {
    if (!same_bits(got[i], portable::exp(xs[i] - 3.25))) {
      ++bad;
      ADD_FAILURE() << "exp_doubles(" << xs[i] << ", shift 3.25) = " << got[i];
    }
  }
}

/// |got - want| in units of the last place of the double nearest want.
double ulps(double got, long double want) {
  const auto w = static_cast<double>(want);
  const double ulp = std::nextafter(std::fabs(w), HUGE_VAL) - std::fabs(w);
  return static_cast<double>(std::fabs(static_cast<long double>(got) - want) / ulp);
}

TEST(ReplayFastKernels, ErfIsWithinTwoUlpEverywhere) {
  std::vector<double> xs;
  std::mt19937_64 gen(12);
  std::uniform_real_distribution<double> wide(-7.0, 7.0), narrow(-3.2, 3.2);
  std::normal_distribution<double> gelu_inputs(0.0, 1.5);
  for (int i = 0; i < 300000; ++i) xs.push_back(wide(gen));
  for (int i = 0; i < 300000; ++i) xs.push_back(narrow(gen));
  for (int i = 0; i < 300000; ++i) xs.push_back(gelu_inputs(gen));
  for (int e = -1074; e < 3; ++e) xs.push_back(std::ldexp(1.0 + static_cast<double>(e & 7) / 8.0, e));  // tiny
  for (double edge : {1.0, 3.0, 6.0}) {  // the pieces' joins
    double x = edge;
    for (int s = 0; s < 20; ++s) x = std::nextafter(x, -HUGE_VAL);
    for (int s = 0; s < 41; ++s, x = std::nextafter(x, HUGE_VAL)) xs.push_back(x), xs.push_back(-x);
  }
  double worst = 0.0, worst_x = 0.0;
  for (double x : xs) {
    const double e = ulps(portable::erf(x), std::erf(static_cast<long double>(x)));
    if (e > worst) worst = e, worst_x = x;
  }
  EXPECT_LE(worst, 2.0) << "at x = " << worst_x;
  std::cout << "erf: worst " << worst << " ulp at x = " << worst_x << "\n";
  // Odd, exact at the ends, NaN for NaN.
  EXPECT_TRUE(same_bits(portable::erf(0.0), 0.0));
  EXPECT_TRUE(same_bits(portable::erf(-0.0), -0.0));
  EXPECT_EQ(portable::erf(HUGE_VAL), 1.0);
  EXPECT_EQ(portable::erf(-HUGE_VAL), -1.0);
  EXPECT_EQ(portable::erf(6.0), 1.0);
  EXPECT_EQ(portable::erf(-40.0), -1.0);
  EXPECT_TRUE(std::isnan(portable::erf(std::numeric_limits<double>::quiet_NaN())));
  for (double x : xs) ASSERT_TRUE(same_bits(portable::erf(-x), -portable::erf(x))) << x;
}

TEST(ReplayFastKernels, ErfsIsErfBitForBit) {
  std::vector<double> xs;
  std::mt19937_64 gen(13);
  std::uniform_real_distribution<double> wide(-8.0, 8.0);
  for (int i = 0; i < 100000; ++i) xs.push_back(wide(gen));
  for (double special : {0.0, -0.0, 1.25, -1.25, 3.0, -3.0, 6.0, HUGE_VAL, -HUGE_VAL, 4.9e-324,
                         std::numeric_limits<double>::quiet_NaN()}) {
    xs.push_back(special);
  }
  std::vector<double> got(xs.size());
  portable::erfs(xs.data(), got.data(), static_cast<Eigen::Index>(xs.size()));
  for (std::size_t i = 0; i < xs.size(); ++i) ASSERT_TRUE(same_bits(got[i], portable::erf(xs[i]))) << xs[i];
}

/// C = A B by the plain loop in the documented order: c_ij = fma(a_i,k-1, b_k-1,j, ... fma(a_i0, b_0j, 0)).
template <typename T>
std::vector<T> plain_product(const std::vector<T>& a, Eigen::Index lda, const std::vector<T>& b, Eigen::Index b_row,
                             Eigen::Index b_col, Eigen::Index m, Eigen::Index n, Eigen::Index k) {
  std::vector<T> c(static_cast<std::size_t>(m * n));
  for (Eigen::Index i = 0; i < m; ++i)
    for (Eigen::Index j = 0; j < n; ++j) {
      T s = T(0);
      for (Eigen::Index t = 0; t < k; ++t) s = std::fma(a[i * lda + t], b[t * b_row + j * b_col], s);
      c[i * n + j] = s;
    }
  return c;
}

template <typename T>
void check_packed(double magnitude) {
  std::mt19937_64 gen(5);
  std::normal_distribution<double> normal(0.0, 1.0);
  const auto draw = [&](Eigen::Index count) {
    std::vector<T> v(static_cast<std::size_t>(count));
    for (T& x : v) x = static_cast<T>(magnitude * normal(gen));
    return v;
  };
  portable::PackedMatrix<T> packed;  // reused across shapes, as replay's scratch is
  for (Eigen::Index m : {1, 2, 5, 11, 12, 13, 25, 197})
    for (Eigen::Index n : {1, 3, 16, 17, 31, 32, 33, 64, 197})
      for (Eigen::Index k : {1, 2, 7, 64, 192}) {
        const Eigen::Index lda = k + 3;  // a strided A
        const std::vector<T> a = draw(m * lda);
        for (const bool transposed : {false, true}) {
          // B itself (row stride n + 1) or the transpose of an n x k matrix (B = K^T, as Q K^T).
          const Eigen::Index b_row = transposed ? 1 : n + 1, b_col = transposed ? k + 2 : 1;
          const std::vector<T> b = draw(transposed ? n * (k + 2) : k * (n + 1));
          packed.pack(b.data(), b_row, b_col, k, n);
          ASSERT_EQ(packed.rows(), k);
          ASSERT_EQ(packed.cols(), n);
          const Eigen::Index ldc = n + 5;
          std::vector<T> c(static_cast<std::size_t>(m * ldc), T(-7));
          portable::gemm_packed(a.data(), lda, packed, c.data(), ldc, m);
          const std::vector<T> want = plain_product(a, lda, b, b_row, b_col, m, n, k);
          for (Eigen::Index i = 0; i < m; ++i) {
            for (Eigen::Index j = 0; j < n; ++j) {
              using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
              ASSERT_EQ(std::bit_cast<Bits>(c[i * ldc + j]), std::bit_cast<Bits>(want[i * n + j]))
                  << "m " << m << " n " << n << " k " << k << " transposed " << transposed << " at " << i << ", " << j;
            }
            for (Eigen::Index j = n; j < ldc; ++j) ASSERT_EQ(c[i * ldc + j], T(-7)) << "wrote past column n";
          }
        }
      }
}

TEST(ReplayFastKernels, GemmPackedIsTheDocumentedOrderBitForBit) {
  check_packed<float>(1.0);
  check_packed<double>(1.0);
  check_packed<float>(1e18);     // products near float's range
  check_packed<double>(1e-160);  // products in the subnormals
}

/// softmax_head_outputs on q, k, v stored as the head's columns of wider rows (as replay's qkv).
void check_head(int n, int d, const Mask* mask, Eigen::Index rows, std::uint64_t seed, double sd) {
  const int width = 3 * d + 5;
  const MatD qkv = test::random_matrix(n, width, seed, 0.0, sd);
  const auto view = [&](int c0) { return qkv.middleCols(c0, d); };
  const Variant softmax = parse_variant("softmax", Convention::Code);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const MatD want = attention_outputs<double>(softmax, view(1), view(1 + d), view(1 + 2 * d), scale, mask);
  Mask kept_rows;
  if (mask) kept_rows = mask->topRows(rows);
  const Eigen::Index ldo = d + 3;
  std::vector<double> out(static_cast<std::size_t>(rows * ldo), -7.0);
  std::vector<int> degenerate;
  softmax_head_outputs(qkv.data() + 1, width, rows, qkv.data() + 1 + d, width, qkv.data() + 1 + 2 * d, width, n, d,
                       d, scale, mask ? &kept_rows : nullptr, out.data(), ldo, &degenerate);
  Diagnostics diag;
  (void)attention_outputs<double>(softmax, view(1).topRows(rows), view(1 + d), view(1 + 2 * d), scale,
                                  mask ? &kept_rows : nullptr, &diag);
  EXPECT_EQ(degenerate, diag.degenerate_rows) << "n " << n << " d " << d;
  for (Eigen::Index i = 0; i < rows; ++i) {
    for (int j = 0; j < d; ++j) {
      ASSERT_TRUE(same_bits(out[static_cast<std::size_t>(i * ldo + j)], want(i, j)))
          << "n " << n << " d " << d << " rows " << rows << " mask " << (mask != nullptr) << " at " << i << ", " << j
          << ": " << out[static_cast<std::size_t>(i * ldo + j)] << " vs " << want(i, j);
    }
    for (Eigen::Index j = d; j < ldo; ++j) ASSERT_EQ(out[static_cast<std::size_t>(i * ldo + j)], -7.0);
  }
}

TEST(ReplayFastKernels, SoftmaxHeadEqualsAttentionOutputsBitForBit) {
  std::uint64_t seed = 100;
  for (int n : {1, 2, 50, 197})
    for (int d : {1, 7, 64})
      for (double sd : {0.5, 3.0, 40.0}) {  // 40: rows dominated by one key, exp underflowing to 0
        for (Eigen::Index rows : {Eigen::Index{n}, Eigen::Index{1}, Eigen::Index{(n + 1) / 2}}) {
          check_head(n, d, nullptr, rows, ++seed, sd);
        }
      }
}

TEST(ReplayFastKernels, SoftmaxHeadWithMasksEqualsAttentionOutputsBitForBit) {
  const TokenGrid grid{1, 14, 14};
  const Mask local = local_window_mask(grid, 3), random = random_outside_mask(grid, 9, 4);
  for (const Mask* m : {&local, &random}) {
    for (Eigen::Index rows : {Eigen::Index{197}, Eigen::Index{1}, Eigen::Index{20}}) check_head(197, 64, m, rows, 7, 1.0);
  }
  // Rows that keep no key: zero, and reported in the library's order.
  Mask sparse = Mask::Constant(50, 50, true);
  sparse.row(3).setConstant(false);
  sparse.row(17).setConstant(false);
  sparse.row(9).head(49).setConstant(false);
  check_head(50, 7, &sparse, 50, 8, 1.0);
  check_head(50, 7, &sparse, 18, 9, 1.0);
}

/// softmax_head_outputs_float against the double head (softmax_head_outputs, the library's bits),
/// q, k, v as the head's columns of wider rows: every output within the error float's rounding
/// allows. With e = 2^-24, each logit s q.k moves by at most
/// delta = s (sum_t |q_t||k_t|) (d + 3) e + |s q.k| e (q and k rounded, d fused steps, the scale);
/// a weight then by at most w (e^(2 delta) - 1 + 5 e) (exp_float's ulp, the sum's and the
/// division's roundings; the division now after the product, in double), and an output by
/// max |v| (that + (n + 2) e) plus n 2^-126 max |v| (exponentials under float's smallest normal);
/// the bound is taken over every row.
void check_float_head(int n, int d, Eigen::Index rows, std::uint64_t seed, double sd) {
  const int width = 3 * d + 5;
  const MatD qkv = test::random_matrix(n, width, seed, 0.0, sd);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const Eigen::Index ldo = d + 3;
  std::vector<double> want(static_cast<std::size_t>(rows * ldo), -7.0), got(want);
  softmax_head_outputs(qkv.data() + 1, width, rows, qkv.data() + 1 + d, width, qkv.data() + 1 + 2 * d, width, n, d, d,
                       scale, nullptr, want.data(), ldo);
  ASSERT_TRUE(softmax_head_outputs_float(qkv.data() + 1, width, rows, qkv.data() + 1 + d, width,
                                         qkv.data() + 1 + 2 * d, width, n, d, d, scale, got.data(), ldo))
      << "n " << n << " d " << d;
  const double e = std::ldexp(1.0, -24);
  const MatD q = qkv.middleCols(1, d), k = qkv.middleCols(1 + d, d), v = qkv.middleCols(1 + 2 * d, d);
  double delta = 0.0;
  for (Eigen::Index i = 0; i < rows; ++i) {
    for (int j = 0; j < n; ++j) {
      const double abs_sum = q.row(i).cwiseAbs().dot(k.row(j).cwiseAbs());
      delta = std::max(delta, scale * abs_sum * (d + 3) * e + std::fabs(scale * q.row(i).dot(k.row(j))) * e);
    }
  }
  const double vmax = v.cwiseAbs().maxCoeff();
  const double bound = vmax * (std::expm1(2 * delta) + (n + 7) * e) + n * std::ldexp(vmax, -126);
  double worst = 0.0;
  for (Eigen::Index i = 0; i < rows; ++i) {
    for (int j = 0; j < d; ++j) {
      worst = std::max(worst, std::fabs(got[static_cast<std::size_t>(i * ldo + j)] - want[static_cast<std::size_t>(i * ldo + j)]));
    }
    for (Eigen::Index j = d; j < ldo; ++j) ASSERT_EQ(got[static_cast<std::size_t>(i * ldo + j)], -7.0);
  }
  EXPECT_LE(worst, bound) << "n " << n << " d " << d << " rows " << rows << " sd " << sd;
}

TEST(ReplayFastKernels, SoftmaxHeadInFloatIsWithinFloatsRoundingOfTheDoubleHead) {
  std::uint64_t seed = 400;
  for (int n : {1, 2, 50, 197})
    for (int d : {1, 7, 64})
      for (double sd : {0.5, 3.0, 10.0})
        for (Eigen::Index rows : {Eigen::Index{n}, Eigen::Index{1}, Eigen::Index{(n + 1) / 2}}) {
          check_float_head(n, d, rows, ++seed, sd);
        }
}

// Values or logits beyond float's range: the float head refuses (returns false) and writes
// nothing; replay then computes the head in double.
TEST(ReplayFastKernels, SoftmaxHeadInFloatRefusesWhatFloatCannotHold) {
  const int n = 20, d = 8, width = 3 * d;
  for (const auto& [what, value] : {std::pair<const char*, double>{"a value beyond float", 1e39},
                                    {"a logit beyond float", 3e19}}) {
    MatD qkv = test::random_matrix(n, width, 31, 0.0, 1.0);
    qkv.middleCols(0, 2 * d).array() *= 0.0;
    qkv.middleCols(0, 2 * d).array() += value;  // q and k: every entry `value`
    std::vector<double> out(static_cast<std::size_t>(n * d), -7.0);
    EXPECT_FALSE(softmax_head_outputs_float(qkv.data(), width, n, qkv.data() + d, width, qkv.data() + 2 * d, width, n, d,
                                            d, 1.0 / std::sqrt(8.0), out.data(), d))
        << what;
    for (double x : out) ASSERT_EQ(x, -7.0) << what;
    // The control: the same head with q and k at 1 is computed.
    qkv.middleCols(0, 2 * d).array() = 1.0;
    EXPECT_TRUE(softmax_head_outputs_float(qkv.data(), width, n, qkv.data() + d, width, qkv.data() + 2 * d, width, n, d,
                                           d, 1.0 / std::sqrt(8.0), out.data(), d))
        << what;
  }
}

/// kernel_head_outputs on q, k, v stored as the head's columns of wider rows, against
/// attention_outputs<double> (the linear-time form), bit for bit; the same errors.
void check_kernel_head(const std::string& spec, int n, int d, Eigen::Index rows, std::uint64_t seed, double sd) {
  const int width = 3 * d + 5;
  const MatD qkv = test::random_matrix(n, width, seed, 0.0, sd);
  const auto view = [&](int c0) { return qkv.middleCols(c0, d); };
  const Variant v = parse_variant(spec);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const Eigen::Index ldo = d + 3;
  std::vector<double> out(static_cast<std::size_t>(rows * ldo), -7.0);
  MatD want;
  std::string want_error, got_error;
  try {
    want = attention_outputs<double>(v, view(1), view(1 + d), view(1 + 2 * d), scale);
  } catch (const NumericalError& e) {
    want_error = e.what();
  }
  try {
    kernel_head_outputs(v, qkv.data() + 1, width, rows, qkv.data() + 1 + d, width, qkv.data() + 1 + 2 * d, width, n, d,
                        d, scale, out.data(), ldo);
  } catch (const NumericalError& e) {
    got_error = e.what();
  }
  if (!want_error.empty() || !got_error.empty()) {
    // Only the rows computed are checked: a failure in a row past `rows` is the library's alone.
    if (rows == n || !got_error.empty()) {
      EXPECT_EQ(got_error, want_error) << spec;
    }
    return;
  }
  for (Eigen::Index i = 0; i < rows; ++i) {
    for (int j = 0; j < d; ++j) {
      ASSERT_TRUE(same_bits(out[static_cast<std::size_t>(i * ldo + j)], want(i, j)))
          << spec << " n " << n << " d " << d << " rows " << rows << " at " << i << ", " << j << ": "
          << out[static_cast<std::size_t>(i * ldo + j)] << " vs " << want(i, j);
    }
    for (Eigen::Index j = d; j < ldo; ++j) ASSERT_EQ(out[static_cast<std::size_t>(i * ldo + j)], -7.0);
  }
}

// The elementwise feature maps' loops (feature_map.cpp) against the Eigen expressions they
// replaced, bit for bit: the kernel heads' features (and every other user's) did not move.
TEST(ReplayFastKernels, ElementwiseFeatureMapsEqualTheEigenExpressions) {
  MatD x = test::random_matrix(197, 64, 21, 0.0, 3.0);
  x(0, 0) = -0.0, x(0, 1) = 0.0, x(0, 2) = -800.0, x(0, 3) = 1e-310, x(0, 4) = -1e-310, x(0, 5) = 700.0;
  const auto same = [](const MatD& a, const MatD& b, const char* what) {
    ASSERT_EQ(a.rows(), b.rows());
    for (Eigen::Index i = 0; i < a.rows(); ++i)
      for (Eigen::Index j = 0; j < a.cols(); ++j) ASSERT_TRUE(same_bits(a(i, j), b(i, j))) << what << " at " << i << ", " << j << ": " << a(i, j) << " vs " << b(i, j);
  };
  same(parse_feature_map("identity").apply<double>(x), x, "identity");
  same(parse_feature_map("relu").apply<double>(x), x.cwiseMax(0.0), "relu");
  same(parse_feature_map("elu1").apply<double>(x),
       (x.cwiseMax(0.0).array() + x.cwiseMin(0.0).array().unaryExpr(portable::Exp{})).matrix(), "elu1");
  same(parse_feature_map("exp").apply<double>(x.cwiseMin(700.0)), x.cwiseMin(700.0).array().unaryExpr(portable::Exp{}).matrix(), "exp");
  // With the convention's factor, through a family, on a strided view.
  const MatD wide = test::random_matrix(50, 70, 22, 0.0, 2.0);
  const auto view = wide.middleCols(3, 64);
  const double factor = std::sqrt(0.125 / 50.0);
  same(query_features(parse_variant("mala@code"), view, TokenPositions{}, 50, 0.125),
       ((view.cwiseMax(0.0).array() + view.cwiseMin(0.0).array().unaryExpr(portable::Exp{})) * factor).matrix(), "mala");
  same(query_features(parse_variant("linear:relu@code"), view, TokenPositions{}, 50, 0.125),
       (view.cwiseMax(0.0) * factor).eval(), "linear");
}

// The negative control of query_features_row_local: relu_affine's features of one row alone are
// not those of the same row among many (so replay computes every row of such a block).
TEST(ReplayFastKernels, ReluAffineQueriesAreNotRowLocal) {
  const Variant v = parse_variant("linear:relu_affine=7");
  EXPECT_FALSE(query_features_row_local(v));
  EXPECT_TRUE(query_features_row_local(parse_variant("linear:relu")));
  EXPECT_TRUE(query_features_row_local(parse_variant("softmax")));
  const MatD q = test::random_matrix(197, 64, 5, 0.0, 1.0);
  const MatD all = query_features(v, q, TokenPositions{}, 197, 0.125);
  bool differs = false;
  for (int seed = 0; seed < 20 && !differs; ++seed) {
    const MatD qs = test::random_matrix(197, 64, 6 + seed, 0.0, 1.0);
    const MatD many = query_features(v, qs, TokenPositions{}, 197, 0.125);
    const MatD one = query_features(v, qs.topRows(1), TokenPositions{}, 197, 0.125);
    differs = (one.row(0) - many.row(0)).cwiseAbs().maxCoeff() != 0.0;
  }
  EXPECT_TRUE(differs) << "one row's relu_affine features equal the many-row ones: the guard is no longer needed";
  (void)all;
}

TEST(ReplayFastKernels, KernelHeadEqualsAttentionOutputsBitForBitForEveryFamily) {
  std::uint64_t seed = 300;
  for (const std::string& spec : test::linear_family_specs()) {
    for (int n : {1, 2, 50, 197})
      for (int d : {1, 7, 64}) {
        check_kernel_head(spec, n, d, n, ++seed, 1.0);
        if (query_features_row_local(parse_variant(spec))) check_kernel_head(spec, n, d, 1, ++seed, 1.0);
      }
    check_kernel_head(spec, 197, 64, 197, ++seed, 30.0);  // large magnitudes: exp maps near overflow
  }
}

}  // namespace
}  // namespace attnscope
