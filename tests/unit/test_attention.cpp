// Every family of the registry against its plain-loop reference: weights, outputs (linear time
// and explicit), row sums, low-rank form, degenerate rows, token order and numerical edge cases.
#include "attnscope/attention.hpp"
#include "attnscope/attention_heads.hpp"
#include "attnscope/error.hpp"
#include "attnscope/softmax.hpp"
#include "compare.hpp"
#include "random_inputs.hpp"
#include "reference.hpp"
#include "tolerances.hpp"
#include "variant_specs.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace attnscope {
namespace {

using test::config;
using test::tolerance;

constexpr std::uint64_t kSeed = 20240611;

class EveryVariant : public ::testing::TestWithParam<std::string> {
 protected:
  Variant variant() const { return parse_variant(GetParam()); }
};

/// Runs `check(inputs, n, d, seed)` over the awkward sizes.
template <typename Check>
void for_awkward_sizes(const Variant& v, Check check) {
  for (int n : test::kAwkwardN) {
    for (int d : test::kAwkwardD) {
      const std::uint64_t seed = kSeed + static_cast<std::uint64_t>(n * 100 + d);
      check(test::random_qkv(n, d, d + 3, seed, test::input_mean(v)), n, d, seed);
    }
  }
}

template <typename T>
void weights_match_reference(const Variant& v) {
  for_awkward_sizes(v, [&](const test::Qkv& in, int n, int d, std::uint64_t seed) {
    const std::string where = config(v.name() + " weights", n, d, seed, test::precision_name<T>());
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    std::vector<int> ref_degenerate;
    const MatD want = reference::weights(v, test::rounded<T>(in.q), test::rounded<T>(in.k), scale,
                                         nullptr, &ref_degenerate);
    Diagnostics diag;
    const Mat<T> got = attention_weights<T>(v, test::as<T>(in.q), test::as<T>(in.k), scale,
                                            nullptr, &diag);
    EXPECT_TRUE(test::matrices_near(got, want, tolerance<T>(), where));
    EXPECT_EQ(diag.degenerate_rows, ref_degenerate) << where;
    EXPECT_TRUE(test::rows_sum_to_one(got, test::row_sum_tolerance<T>(), where, diag.degenerate_rows));
  });
}

template <typename T>
void outputs_match_reference(const Variant& v) {
  for_awkward_sizes(v, [&](const test::Qkv& in, int n, int d, std::uint64_t seed) {
    const std::string where = config(v.name() + " outputs", n, d, seed, test::precision_name<T>());
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    std::vector<int> ref_degenerate;
    const MatD want = reference::outputs(v, test::rounded<T>(in.q), test::rounded<T>(in.k),
                                         test::rounded<T>(in.v), scale, nullptr, &ref_degenerate);
    const Mat<T> q = test::as<T>(in.q), k = test::as<T>(in.k), values = test::as<T>(in.v);
    Diagnostics fast_diag, explicit_diag;
    const Mat<T> fast = attention_outputs<T>(v, q, k, values, scale, nullptr, &fast_diag);
    const Mat<T> slow = attention_outputs_explicit<T>(v, q, k, values, scale, nullptr, &explicit_diag);
    EXPECT_TRUE(test::matrices_near(fast, want, tolerance<T>(), where + " (attention_outputs)"));
    EXPECT_TRUE(test::matrices_near(slow, want, tolerance<T>(), where + " (explicit)"));
    EXPECT_TRUE(test::matrices_near(fast, slow.template cast<double>(), tolerance<T>(),
                                    where + " (linear time vs explicit)"));
    EXPECT_EQ(fast_diag.degenerate_rows, ref_degenerate) << where;
    EXPECT_EQ(explicit_diag.degenerate_rows, ref_degenerate) << where;
  });
}

TEST_P(EveryVariant, WeightsMatchReferenceDouble) { weights_match_reference<double>(variant()); }
TEST_P(EveryVariant, WeightsMatchReferenceFloat) { weights_match_reference<float>(variant()); }
TEST_P(EveryVariant, OutputsMatchReferenceDouble) { outputs_match_reference<double>(variant()); }
TEST_P(EveryVariant, OutputsMatchReferenceFloat) { outputs_match_reference<float>(variant()); }

TEST_P(EveryVariant, LowRankFormReproducesWeights) {
  const Variant v = variant();
  if (!v.linear_time_outputs()) {
    EXPECT_THROW((void)low_rank_form<double>(v, MatD::Ones(2, 2), MatD::Ones(2, 2), 1.0), UsageError)
        << v.name();
    return;
  }
  for_awkward_sizes(v, [&](const test::Qkv& in, int n, int d, std::uint64_t seed) {
    const std::string where = config(v.name() + " low-rank", n, d, seed, "double");
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    Diagnostics weights_diag, form_diag;
    const MatD w = attention_weights<double>(v, in.q, in.k, scale, nullptr, &weights_diag);
    const LowRankForm form = low_rank_form<double>(v, in.q, in.k, scale, &form_diag);
    const Eigen::Index r = form.Z.cols();
    EXPECT_EQ(r, v.kernel()->feature_dim(v, d) + (v.kernel()->has_offset() ? 1 : 0)) << where;
    EXPECT_EQ(form.M.rows(), r) << where;
    EXPECT_TRUE(test::matrices_near(MatD(form.Z * form.M), w, test::kDoubleTol, where));
    EXPECT_EQ(form_diag.degenerate_rows, weights_diag.degenerate_rows) << where;
  });
}

INSTANTIATE_TEST_SUITE_P(Attention, EveryVariant, ::testing::ValuesIn(test::all_variant_specs()),
                         [](const auto& p) { return test::param_name(p.param); });

// --- degenerate rows ---------------------------------------------------------------------------

/// Keys with positive entries, and query rows 1 and 3 entirely negative: ReLU zeroes them.
test::Qkv relu_killed_inputs() {
  test::Qkv in = test::random_qkv(6, 5, 4, kSeed, 0.0);
  in.k = in.k.cwiseAbs();
  in.q.row(1) = -in.q.row(1).cwiseAbs() - MatD::Constant(1, 5, 0.1);
  in.q.row(3) = -in.q.row(3).cwiseAbs() - MatD::Constant(1, 5, 0.1);
  in.q.row(0) = in.q.row(0).cwiseAbs();  // at least one live query
  return in;
}

TEST(Degenerate, ReluKilledQueryIsReportedAndZero) {
  const test::Qkv in = relu_killed_inputs();
  for (const char* spec : {"linear:relu", "mala:relu", "linear:relu@code", "mala:relu@code"}) {
    const Variant v = parse_variant(spec);
    Diagnostics wd, od, ld;
    const MatD w = attention_weights<double>(v, in.q, in.k, 0.5, nullptr, &wd);
    const MatD o = attention_outputs<double>(v, in.q, in.k, in.v, 0.5, nullptr, &od);
    const LowRankForm form = low_rank_form<double>(v, in.q, in.k, 0.5, &ld);
    const std::vector<int> expected{1, 3};
    EXPECT_EQ(wd.degenerate_rows, expected) << v.name();
    EXPECT_EQ(od.degenerate_rows, expected) << v.name();
    EXPECT_EQ(ld.degenerate_rows, expected) << v.name();
    EXPECT_TRUE(w.allFinite() && o.allFinite() && form.Z.allFinite()) << v.name();
    for (int row : expected) {
      EXPECT_TRUE(w.row(row).isZero(0.0)) << v.name() << " row " << row;
      EXPECT_TRUE(o.row(row).isZero(0.0)) << v.name() << " row " << row;
    }
    EXPECT_TRUE(test::rows_sum_to_one(w, test::kRowSumDoubleTol, v.name(), expected));
  }
}

// relu: EfficientViT's ReLU linear attention. Its paper form is linear:relu (scale-free rows,
// the relative tiny rule); its code form divides by S_i + 1e-15, so rows of queries and keys whose
// ReLU products sum to ~1e-15 sum to S_i/(S_i + 1e-15), not 1, and stay rows (not degenerate).
TEST(ReluFamily, CodeEpsShrinksTinyRowsPaperFormIsLinearRelu) {
  const Variant code = parse_variant("relu@code"), paper = parse_variant("relu@paper");
  EXPECT_FALSE(code.rows_sum_to_one());
  EXPECT_TRUE(paper.rows_sum_to_one());
  const test::Qkv in = relu_killed_inputs();
  const std::vector<int> dead{1, 3};
  for (double size : {1.0, 1e-8}) {
    const MatD q = size * in.q, k = size * in.k;
    const std::string where = "relu N=6 d=5 inputs x " + std::to_string(size);
    Diagnostics cd, pd;
    const MatD wc = attention_weights<double>(code, q, k, 0.5, nullptr, &cd);
    const MatD wp = attention_weights<double>(paper, q, k, 0.5, nullptr, &pd);
    EXPECT_EQ(cd.degenerate_rows, dead) << where;
    EXPECT_EQ(pd.degenerate_rows, dead) << where;
    EXPECT_TRUE(test::matrices_near(wp, attention_weights<double>(parse_variant("linear:relu@code"), q, k,
                                                                  0.5),
                                    test::kDoubleTol, where + " paper vs linear:relu"));
    const MatD rq = q.cwiseMax(0.0), rk = k.cwiseMax(0.0);
    for (Eigen::Index i = 0; i < q.rows(); ++i) {
      const double S = rq.row(i).dot(rk.colwise().sum());
      if (S == 0.0) continue;
      const double sum = wc.row(i).sum();
      EXPECT_NEAR(sum, S / (S + 1e-15), 1e-13) << where << " row " << i;
      EXPECT_NEAR(wp.row(i).sum(), 1.0, 1e-13) << where << " row " << i;
      if (size < 1e-4) {
        EXPECT_LT(sum, 0.9) << where << " row " << i << ": the eps must show";
      }
    }
  }
}

TEST(Degenerate, InlineWithKilledQueryIsUniform) {
  // phi(q) = 0 leaves InLine well defined: every weight is 1/N (eq. 4), nothing degenerate.
  const test::Qkv in = relu_killed_inputs();
  Diagnostics diag;
  const MatD w = attention_weights<double>(parse_variant("inline:relu"), in.q, in.k, 0.5, nullptr, &diag);
  EXPECT_TRUE(diag.clean());
  EXPECT_TRUE(test::matrices_near(MatD(w.row(1)), MatD::Constant(1, 6, 1.0 / 6.0),
                                  test::kDoubleTol, "inline:relu killed row 1"));
}

TEST(Degenerate, TinyLinearDenominatorIsReported) {
  // identity map: q orthogonal to the key sum gives a zero denominator without a zero phi(q).
  MatD q(2, 2), k(2, 2);
  q << 1.0, -1.0, 0.5, 0.25;
  k << 1.0, 2.0, 2.0, 1.0;  // key sum (3, 3), orthogonal to q_0
  for (const char* spec : {"linear:identity", "mala:identity"}) {
    Diagnostics diag;
    const MatD w = attention_weights<double>(parse_variant(spec), q, k, 1.0, nullptr, &diag);
    EXPECT_EQ(diag.degenerate_rows, std::vector<int>{0}) << spec;
    EXPECT_TRUE(w.allFinite()) << spec;
  }
}

TEST(Degenerate, FloatReluKilledQueryIsReported) {
  const test::Qkv in = relu_killed_inputs();
  Diagnostics diag;
  const MatF o = attention_outputs<float>(parse_variant("linear:relu"), test::as<float>(in.q),
                                          test::as<float>(in.k), test::as<float>(in.v), 0.5,
                                          nullptr, &diag);
  EXPECT_EQ(diag.degenerate_rows, (std::vector<int>{1, 3}));
  EXPECT_TRUE(o.allFinite());
}

// --- numerical edge cases ----------------------------------------------------------------------

TEST(Numerics, SoftmaxNeverOverflows) {
  const test::Qkv in = test::random_qkv(50, 7, 3, kSeed, 0.0);
  const MatF q = test::as<float>(in.q * 1e3), k = test::as<float>(in.k * 1e3);
  const MatF w = attention_weights<float>(parse_variant("softmax"), q, k, 1.0);
  ASSERT_TRUE(w.allFinite());
  EXPECT_TRUE(test::rows_sum_to_one(w, test::kRowSumFloatTol, "softmax logits ~1e6 float"));
}

TEST(Numerics, ExpFeatureMapOverflowThrowsNamingTheRow) {
  // Attention computes in double for both precisions, so exp overflows past ~709.
  test::Qkv in = test::random_qkv(4, 3, 2, kSeed, 0.0);
  in.k(2, 1) = 1000.0;
  try {
    (void)attention_weights<float>(parse_variant("linear:exp"), test::as<float>(in.q),
                                   test::as<float>(in.k), 1.0);
    FAIL() << "linear:exp with a key entry of 1000 should throw NumericalError";
  } catch (const NumericalError& e) {
    EXPECT_NE(std::string(e.what()).find("row 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)attention_outputs<double>(parse_variant("mala:exp"), in.q, in.k, in.v, 1.0),
               NumericalError);
  EXPECT_THROW((void)low_rank_form<double>(parse_variant("inline:exp"), in.q, in.k, 1.0),
               NumericalError);
}

// --- properties from the papers ----------------------------------------------------------------

TEST(Properties, LinearReluIgnoresQueryMagnitude) {
  // Prop. 2 / MALA eq. 7: phi(2q) = 2 phi(q) for ReLU, so rows for q and 2q are identical
  // (doubling is exact in binary floating point, so equality is exact).
  const test::Qkv in = test::random_qkv(50, 7, 3, kSeed, 0.0);
  MatD q(2, 7);
  q.row(0) = in.q.row(0).cwiseAbs();
  q.row(1) = 2.0 * q.row(0);
  const MatD lin = attention_weights<double>(parse_variant("linear:relu"), q, in.k, 1.0);
  EXPECT_EQ(lin.row(0), lin.row(1));
  // Softmax and MALA do see the magnitude (MALA eq. 11-12).
  for (const char* spec : {"softmax", "mala:relu"}) {
    const MatD w = attention_weights<double>(parse_variant(spec), q, in.k, 1.0);
    EXPECT_GT((w.row(0) - w.row(1)).cwiseAbs().maxCoeff(), 1e-6) << spec;
  }
}

TEST(Properties, MalaBetaGammaScaleAsEquation11) {
  // Scaling phi(q) by a: beta_new = (beta + a - 1)/a, gamma_new = a gamma (identity map, so
  // scaling q scales phi(q)).
  const test::Qkv in = test::random_qkv(30, 5, 2, kSeed, 1.0);
  const double a = 3.0;
  MatD q(2, 5);
  q.row(0) = in.q.row(0);
  q.row(1) = a * in.q.row(0);
  const LowRankForm f = low_rank_form<double>(parse_variant("mala:identity"), q, in.k, 1.0);
  const double beta = f.Z(0, 0) / q(0, 0), gamma = f.Z(0, 5);
  const double beta_new = f.Z(1, 0) / q(1, 0), gamma_new = f.Z(1, 5);
  EXPECT_NEAR(beta_new, (beta + a - 1.0) / a, 1e-12 * beta);
  EXPECT_NEAR(gamma_new, a * gamma, 1e-12 * std::abs(a * gamma));
}

TEST(Properties, CodeConventionMatchesReleasedFormulas) {
  // InLine code: (s/N)(q.k_j - mean_m q.k_m) + 1/N.  MALA code: z = s phi(q).mean phi(k),
  // w = (s/N) phi(q).phi(k_j) (1 + 1/z) - z/N.  Written here from the released code's form.
  const test::Qkv in = test::random_qkv(20, 6, 2, kSeed, 0.0);
  const double s = 0.4;
  const double n = 20.0;
  const MatD inl = attention_weights<double>(parse_variant("inline@code"), in.q, in.k, s);
  const MatD mala = attention_weights<double>(parse_variant("mala@code"), in.q, in.k, s);
  const MatD fq = reference::feature_map(parse_feature_map("elu1"), in.q);
  const MatD fk = reference::feature_map(parse_feature_map("elu1"), in.k);
  MatD want_inline(20, 20), want_mala(20, 20);
  for (int i = 0; i < 20; ++i) {
    double mean_qk = 0.0, z = 0.0;
    for (int m = 0; m < 20; ++m) {
      mean_qk += in.q.row(i).dot(in.k.row(m)) / n;
      z += s * fq.row(i).dot(fk.row(m)) / n;
    }
    for (int j = 0; j < 20; ++j) {
      want_inline(i, j) = (s / n) * (in.q.row(i).dot(in.k.row(j)) - mean_qk) + 1.0 / n;
      want_mala(i, j) = (s / n) * fq.row(i).dot(fk.row(j)) * (1.0 + 1.0 / z) - z / n;
    }
  }
  EXPECT_TRUE(test::matrices_near(inl, want_inline, test::kDoubleTol, "inline@code"));
  EXPECT_TRUE(test::matrices_near(mala, want_mala, test::kDoubleTol, "mala@code"));
}

// --- argument checks ---------------------------------------------------------------------------

TEST(Arguments, ShapeMismatchAndUnsupportedVariantThrow) {
  const MatD q = MatD::Ones(3, 4), k = MatD::Ones(3, 5), v = MatD::Ones(2, 2);
  const Variant softmax = parse_variant("softmax");
  EXPECT_THROW((void)attention_weights<double>(softmax, q, k, 1.0), UsageError);
  EXPECT_THROW((void)attention_outputs<double>(softmax, q, q, v, 1.0), UsageError);
  const Mask wrong = Mask::Constant(2, 3, true);
  EXPECT_THROW((void)attention_weights<double>(softmax, q, q, 1.0, &wrong), UsageError);
  EXPECT_THROW((void)attention_weights<double>(parse_variant("mala@code+rope"), q, q, 1.0),
               UsageError);
}

// Every family of the registry has its own reference file, and one family's reference is not
// another's: the references differ wherever the formulas do.
TEST(Registry, EveryFamilyHasItsReference) {
  ASSERT_GE(all_families().size(), 6U);
  for (const AttentionFamily* f : all_families()) {
    EXPECT_TRUE(reference::has_weights(f->name())) << f->name() << ": no lib/src/reference/families/"
                                                   << f->name() << ".cpp";
  }
  EXPECT_FALSE(reference::has_weights("no_such_family"));
}

/// Bits of two double buffers equal (NaN == NaN, -0 != +0).
bool same_bits(const double* a, const double* b, Eigen::Index n) {
  return std::memcmp(a, b, static_cast<std::size_t>(n) * sizeof(double)) == 0;
}

// The score form through the registry computes exactly what softmax.hpp's functions compute,
// operation for operation: what the engine, confusion, locality and replay now ask the family for.
TEST(Registry, ScoreFormOperationsAreSoftmaxsBitForBit) {
  const ScoreFamily* f = parse_variant("softmax").score();
  ASSERT_NE(f, nullptr);
  for (int n : {1, 2, 63, 197}) {
    for (int d : {1, 7, 60}) {
      for (double magnitude : {1.0, 40.0, 1e150}) {
        const std::uint64_t seed =
            7 * static_cast<std::uint64_t>(n) + static_cast<std::uint64_t>(d);
        const std::string what =
            test::config("softmax", n, d, seed, "magnitude " + std::to_string(magnitude));
        const MatD q = magnitude * test::random_matrix(n, d, seed),
                   k = test::random_matrix(n, d, seed + 1);
        const double scale = 1.0 / std::sqrt(static_cast<double>(d));
        // rows(): a block of logits, with a mask that empties row 0.
        const Mask mask = test::random_mask(n, n, 0.7, seed + 2, 1);
        MatD a = q * k.transpose(), b = a;
        std::vector<int> da, db;
        f->rows(a, 0, scale, &mask, da);
        softmax_rows(b, 0, scale, &mask, db);
        EXPECT_TRUE(same_bits(a.data(), b.data(), a.size())) << what;
        EXPECT_EQ(da, db) << what;
        EXPECT_EQ(da, std::vector<int>{0}) << what;  // the row that keeps no key
        // exact_row() and exact_row_t() with the keys transposed by transpose_keys().
        const MatF kf = k.cast<float>();
        const MatD kw = kf.cast<double>();
        MatD kt1, kt2;
        f->transpose_keys(kf, kt1);
        transpose_keys(kf, kt2);
        EXPECT_TRUE(same_bits(kt1.data(), kt2.data(), kt1.size())) << what;
        VecD r1(n), r2(n), r3(n);
        for (int i = 0; i < n; ++i) {
          f->exact_row(q.row(i).data(), kw.data(), n, d, scale, r1.data());
          softmax_exact_row(q.row(i).data(), kw.data(), n, d, scale, r2.data());
          f->exact_row_t(q.row(i).data(), kt1.data(), n, d, scale, r3.data());
          ASSERT_TRUE(same_bits(r1.data(), r2.data(), n)) << what << ", row " << i;
          ASSERT_TRUE(same_bits(r1.data(), r3.data(), n))
              << what << ", row " << i << " (transposed keys)";
        }
        // rows_float(): in the float range only.
        if (magnitude < 1e3) {
          const MatF qf = q.cast<float>();
          MatF w1, w2;
          f->rows_float(qf, kf, scale, w1);
          softmax_rows_float(qf, kf, scale, w2);
          EXPECT_EQ(std::memcmp(w1.data(), w2.data(),
                                static_cast<std::size_t>(w1.size()) * sizeof(float)),
                    0)
              << what;
          // rows_float_factored(): its exponentials times each row's factor are those weights.
          MatF e;
          std::vector<float> factor;
          f->rows_float_factored(qf, kf, scale, e, factor);
          ASSERT_EQ(factor.size(), static_cast<std::size_t>(n)) << what;
          MatF w3(n, n);
          for (int i = 0; i < n; ++i) {
            for (int j = 0; j < n; ++j) w3(i, j) = e(i, j) * factor[static_cast<std::size_t>(i)];
          }
          EXPECT_EQ(std::memcmp(w1.data(), w3.data(),
                                static_cast<std::size_t>(w1.size()) * sizeof(float)),
                    0)
              << what << " (factored)";
        }
        // head_outputs(): W V of every row, bit for bit the engine's attention_outputs.
        const MatD v = test::random_matrix(n, 3, seed + 3);
        MatD out(n, 3);
        f->head_outputs(q.data(), d, n, k.data(), d, v.data(), 3, n, d, 3, scale, nullptr,
                        out.data(), 3, nullptr);
        const MatD want = attention_outputs<double>(parse_variant("softmax"), q, k, v, scale);
        EXPECT_TRUE(same_bits(out.data(), want.data(), out.size())) << what;
      }
    }
  }
  // Negative control: the comparison sees a one-ulp change.
  const MatD q = test::random_matrix(5, 4, 3), k = test::random_matrix(5, 4, 4);
  VecD r1(5), r2(5);
  f->exact_row(q.row(0).data(), k.data(), 5, 4, 0.5, r1.data());
  softmax_exact_row(q.row(0).data(), k.data(), 5, 4, std::nextafter(0.5, 1.0), r2.data());
  EXPECT_FALSE(same_bits(r1.data(), r2.data(), 5));
  // A kernel family hands out no score form.
  EXPECT_EQ(parse_variant("linear:relu").score(), nullptr);
}

// Token order: permuting queries and keys together permutes W (W(PQ, PK) = P W P^T) for every
// family whose weights do not depend on position; for a positional family (cosformer) it does
// not, which is the negative control of the check.
TEST_P(EveryVariant, PermutingTokensPermutesWeightsUnlessPositional) {
  const Variant v = variant();
  const int n = 12, d = 5;
  const auto in = test::random_qkv(n, d, d, kSeed + 7, test::input_mean(v));
  Eigen::PermutationMatrix<Eigen::Dynamic> p(n);
  p.setIdentity();
  for (int i = 0; i < n; ++i) p.indices()[i] = (i * 5 + 3) % n;  // a full cycle-mix of 12
  const MatD w = attention_weights<double>(v, in.q, in.k, 0.5);
  const MatD wp = attention_weights<double>(v, MatD(p * in.q), MatD(p * in.k), 0.5);
  const double gap = (wp - p * w * p.transpose()).cwiseAbs().maxCoeff();
  const double size = std::max(1.0, w.cwiseAbs().maxCoeff());
  if (v.family->position_dependent()) {
    EXPECT_GT(gap, 1e-6 * size) << v.name() << ": positional weights ignored the permutation";
  } else {
    EXPECT_LE(gap, 1e-12 * size) << v.name();
  }
}

}  // namespace
}  // namespace attnscope
