// portable_math.hpp: exp within its stated ulps of a long-double reference, products bit for bit
// equal to a plain loop in the documented order on awkward sizes and magnitudes, and the build's
// floating-point model (no contraction) in every source whose margins rely on it.
#include "attnscope/lane_sum.hpp"
#include "attnscope/layout.hpp"
#include "attnscope/portable_math.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace attnscope {
namespace {

/// lane_sum's tree of its 16 lanes written out: lane l takes lane l + 8, then l + 4, l + 2, l + 1.
template <typename T>
T written_tree(const std::array<T, 16>& x) {
  const auto a = [&x](std::size_t l) { return x[l] + x[l + 8]; };
  return ((a(0) + a(4)) + (a(2) + a(6))) + ((a(1) + a(5)) + (a(3) + a(7)));
}

/// |got - want| in units of the last place of the double nearest want (long double reference).
double ulps_double(double got, long double want) {
  const auto w = static_cast<double>(want);
  const double ulp = std::nextafter(std::fabs(w), HUGE_VAL) - std::fabs(w);
  return static_cast<double>(std::fabs(static_cast<long double>(got) - want) / ulp);
}

double ulps_float(float got, long double want) {
  const auto w = static_cast<float>(want);
  const float ulp = std::nextafter(std::fabs(w), HUGE_VALF) - std::fabs(w);
  return static_cast<double>(std::fabs(static_cast<long double>(got) - want) / ulp);
}

TEST(PortableMath, ExpIsWithinOneUlpEverywhere) {
  std::mt19937_64 gen(7);
  double worst = 0.0, worst_x = 0.0;
  const auto check = [&](double x) {
    const long double want = std::exp(static_cast<long double>(x));
    if (!(want < static_cast<long double>(std::numeric_limits<double>::max()))) return;
    if (want < static_cast<long double>(std::numeric_limits<double>::min())) return;  // subnormal: below
    const double e = ulps_double(portable::exp(x), want);
    if (e > worst) worst = e, worst_x = x;
  };
  for (const auto& [lo, hi] : {std::pair{-1e-8, 1e-8}, {-1.0, 1.0}, {-40.0, 40.0}, {-708.0, 709.7}}) {
    std::uniform_real_distribution<double> u(lo, hi);
    for (int i = 0; i < 400000; ++i) check(u(gen));
  }
  for (int n = -1020; n <= 1023; ++n) {  // near the reduction's boundaries k ln2 +- ln2 / 2
    const double c = n * 0.6931471805599453;
    for (double off : {-0.3465735902799726, -1e-12, 0.0, 1e-12, 0.3465735902799726}) check(c + off);
  }
  EXPECT_LT(worst, 1.0) << "worst at x = " << worst_x;
  EXPECT_GT(worst, 0.0) << "a reference that agrees everywhere checked nothing";
}

TEST(PortableMath, ExpEdgesAndSubnormals) {
  EXPECT_EQ(portable::exp(0.0), 1.0);
  EXPECT_EQ(portable::exp(-0.0), 1.0);
  EXPECT_EQ(portable::exp(-HUGE_VAL), 0.0);
  EXPECT_EQ(portable::exp(HUGE_VAL), HUGE_VAL);
  EXPECT_EQ(portable::exp(710.0), HUGE_VAL);
  EXPECT_EQ(portable::exp(-746.0), 0.0);
  EXPECT_TRUE(std::isnan(portable::exp(std::nan(""))));
  EXPECT_LT(ulps_double(portable::exp(709.78), std::exp(static_cast<long double>(709.78))), 1.0)
      << "the largest finite results";
  // Subnormal results: within one subnormal step (2^-1074) of the reference.
  for (double x = -745.0; x < -708.5; x += 0.37) {
    const long double want = std::exp(static_cast<long double>(x));
    EXPECT_LE(std::fabs(static_cast<long double>(portable::exp(x)) - want), 0x1p-1074L) << "x = " << x;
  }
}

TEST(PortableMath, LogIsWithinOneUlpEverywhere) {
  std::mt19937_64 gen(9);
  double worst = 0.0, worst_x = 0.0;
  const auto check = [&](double x) {
    const long double want = std::log(static_cast<long double>(x));
    if (want == 0.0L) {
      EXPECT_EQ(portable::log(x), 0.0) << "x = " << x;
      return;
    }
    const double e = ulps_double(portable::log(x), want);
    if (e > worst) worst = e, worst_x = x;
  };
  for (const auto& [lo, hi] : {std::pair{0.5, 2.0}, {1.0 - 1e-6, 1.0 + 1e-6}, {1e-300, 1e-250}, {1e-3, 1e3}, {1e250, 1e300}}) {
    std::uniform_real_distribution<double> u(lo, hi);
    for (int i = 0; i < 300000; ++i) check(u(gen));
  }
  for (double x : {1.4142135623730951, 1.4142135623730954, 0.7071067811865476, 4.9406564584124654e-324,
                   2.2250738585072009e-308, 1.7976931348623157e308, 3.0, 10.0}) {
    check(x);
  }
  EXPECT_LT(worst, 1.0) << "worst at x = " << worst_x;
  EXPECT_GT(worst, 0.0);
  EXPECT_EQ(portable::log(1.0), 0.0);
  EXPECT_EQ(portable::log(0.0), -HUGE_VAL);
  EXPECT_EQ(portable::log(HUGE_VAL), HUGE_VAL);
  EXPECT_TRUE(std::isnan(portable::log(-1.0)));
  EXPECT_TRUE(std::isnan(portable::log(std::nan(""))));
}

TEST(PortableMath, PolarPairsAreStandardNormalAndRejectOutsideTheDisc) {
  double a = 0.0, b = 0.0;
  EXPECT_FALSE(portable::polar_normal_pair(0.9, 0.9, a, b)) << "outside the unit disc";
  EXPECT_FALSE(portable::polar_normal_pair(0.0, 0.0, a, b)) << "the centre";
  ASSERT_TRUE(portable::polar_normal_pair(0.6, 0.0, a, b));
  EXPECT_NEAR(a, 0.6 * std::sqrt(-2.0 * std::log(0.36) / 0.36), 1e-15);
  EXPECT_EQ(b, 0.0);
  // Moments of many pairs (a statistical check with a fixed seed: mean 0, variance 1).
  std::mt19937_64 gen(1);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  double sum = 0.0, sum2 = 0.0;
  int n = 0;
  while (n < 400000) {
    if (!portable::polar_normal_pair(u(gen), u(gen), a, b)) continue;
    sum += a + b, sum2 += a * a + b * b, n += 2;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sum2 / n, 1.0, 0.01);
}

TEST(PortableMath, FloatExpIsWithinItsBoundAndFlushesOnlyBelowTheRange) {
  std::mt19937_64 gen(11);
  std::uniform_real_distribution<float> u(-87.3F, 88.7F);
  double worst = 0.0;
  float worst_x = 0.0F;
  for (int i = 0; i < 2000000; ++i) {
    const float x = u(gen);
    const double e = ulps_float(portable::exp_float(x), std::exp(static_cast<long double>(x)));
    if (e > worst) worst = e, worst_x = x;
  }
  EXPECT_LT(worst, 1.0) << "worst at x = " << worst_x;
  EXPECT_GT(worst, 0.0) << "a reference that agrees everywhere checked nothing";
  EXPECT_EQ(portable::exp_float(0.0F), 1.0F);
  EXPECT_EQ(portable::exp_float(-200.0F), 0.0F);
  EXPECT_EQ(portable::exp_float(100.0F), HUGE_VALF);
  EXPECT_EQ(portable::exp_float(-HUGE_VALF), 0.0F);
  EXPECT_TRUE(std::isnan(portable::exp_float(std::nanf(""))));
  EXPECT_LT(ulps_float(portable::exp_float(88.72F), std::exp(static_cast<long double>(88.72F))), 1.0)
      << "the largest finite results";
  // Below the normal range the result is 0, off by less than the smallest normal float.
  for (float x = -103.0F; x < -87.0F; x += 0.25F) {
    const long double want = std::exp(static_cast<long double>(x));
    EXPECT_LE(std::fabs(static_cast<long double>(portable::exp_float(x)) - want), 0x1p-126L) << "x = " << x;
  }
  // The array form is the scalar form.
  std::vector<float> xs{-3.5F, 0.0F, 1e-7F, 20.0F, -90.0F};
  std::vector<float> ys = xs;
  portable::exp_floats(ys.data(), static_cast<Eigen::Index>(ys.size()));
  for (std::size_t i = 0; i < xs.size(); ++i) EXPECT_EQ(ys[i], portable::exp_float(xs[i]));
}

TEST(PortableMath, MaxScaledIsThePlainLoop) {
  std::mt19937_64 gen(5);
  std::normal_distribution<float> z(0.0F, 30.0F);
  for (const Eigen::Index n : {0, 1, 7, 15, 16, 17, 63, 64, 65, 127, 128, 129, 197, 257}) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (float& v : x) v = z(gen);
    const std::vector<float> before = x;
    // The largest entry in every position: every running maximum, lane and the tail are searched.
    for (Eigen::Index p = 0; p < n; ++p) {
      std::vector<float> y = x;
      y[static_cast<std::size_t>(p)] = 1e4F;
      EXPECT_EQ(portable::max_scaled(y.data(), n, 0.5F), 5e3F) << "n = " << n << " at " << p;
    }
    float top = -HUGE_VALF;
    for (const float v : x) top = std::max(top, v * 0.125F);
    EXPECT_EQ(portable::max_scaled(x.data(), n, 0.125F), top) << "n = " << n;
    EXPECT_EQ(x, before) << "n = " << n << ": nothing written";
    // The largest entry in the last, partial vector is found too.
    if (n > 0) {
      x.back() = 1e30F;
      EXPECT_EQ(portable::max_scaled(x.data(), n, 1.0F), 1e30F) << "n = " << n;
    }
  }
}

// max_scaled: the largest fl(x s), for either sign of s; exp_floats_sum: each entry
// exp_float(fl(x s) - shift), what scaling then exp_floats give, bit for bit, and the sum in
// lane_sum's order.
TEST(PortableMath, MaxScaledAndExpFloatsSumAreTheirPlainLoops) {
  std::mt19937_64 gen(6);
  std::normal_distribution<float> z(0.0F, 30.0F);
  for (const Eigen::Index n : {0, 1, 7, 15, 16, 17, 31, 33, 64, 197}) {
    for (const float s : {0.125F, 0.3F, -0.7F}) {
      std::vector<float> x(static_cast<std::size_t>(n));
      for (float& v : x) v = z(gen);
      std::vector<float> scaled = x;
      float top = -HUGE_VALF;
      for (float& v : scaled) top = std::max(top, v *= s);
      EXPECT_EQ(portable::max_scaled(x.data(), n, s), top) << "n = " << n << " s = " << s;
      if (n == 0) continue;
      std::vector<float> want = scaled;
      portable::exp_floats(want.data(), n, top);
      const double want_sum =
          lane_sum(n, [&want](Eigen::Index t) { return static_cast<double>(want[static_cast<std::size_t>(t)]); });
      std::vector<float> got = x;
      const double sum = portable::exp_floats_sum(got.data(), n, s, top);
      EXPECT_EQ(got, want) << "n = " << n << " s = " << s;
      EXPECT_EQ(sum, want_sum) << "n = " << n << " s = " << s;
      EXPECT_GE(sum, 1.0) << "exp(0) is a term";
    }
  }
  // The largest product in the last, partial vector is found too.
  std::vector<float> x(33, -1.0F);
  x.back() = 4.0F;
  EXPECT_EQ(portable::max_scaled(x.data(), 33, 0.5F), 2.0F);
  EXPECT_EQ(portable::max_scaled(x.data(), 33, -0.5F), 0.5F);
}

// exp_floats_sums: every row the bits of exp_floats_sum on it, its entries and its sum, for any
// number of rows (groups of several and the rest) and row lengths around the vector widths; rows
// at a stride longer than their length leave the entries between them alone.
TEST(PortableMath, ExpFloatsSumsAreExpFloatsSumRowByRow) {
  std::mt19937_64 gen(8);
  std::normal_distribution<float> z(0.0F, 20.0F);
  for (const Eigen::Index rows : {1, 2, 3, 4, 5, 8, 9}) {
    for (const Eigen::Index n : {1, 5, 16, 17, 63, 197, 200}) {
      const Eigen::Index ld = n + 3;
      std::vector<float> x(static_cast<std::size_t>(rows * ld));
      for (float& v : x) v = z(gen);
      const float s = 0.3F;
      std::vector<float> shifts(static_cast<std::size_t>(rows));
      for (Eigen::Index r = 0; r < rows; ++r) shifts[static_cast<std::size_t>(r)] = portable::max_scaled(x.data() + r * ld, n, s);
      std::vector<float> want = x;
      std::vector<double> want_sums(static_cast<std::size_t>(rows));
      for (Eigen::Index r = 0; r < rows; ++r) {
        want_sums[static_cast<std::size_t>(r)] =
            portable::exp_floats_sum(want.data() + r * ld, n, s, shifts[static_cast<std::size_t>(r)]);
      }
      std::vector<float> got = x;
      std::vector<double> sums(static_cast<std::size_t>(rows), -1.0);
      portable::exp_floats_sums(got.data(), ld, rows, n, s, shifts.data(), sums.data());
      EXPECT_EQ(got, want) << rows << " rows of " << n;
      EXPECT_EQ(sums, want_sums) << rows << " rows of " << n;
      // And the definition, element by element: the scalar exp_float of the rounded product less
      // the shift (the rows' ends, which go through their own buffer, included); the three
      // entries between rows untouched; each sum the row's sum_widened.
      for (Eigen::Index r = 0; r < rows; ++r) {
        const float shift = shifts[static_cast<std::size_t>(r)];
        for (Eigen::Index t = 0; t < ld; ++t) {
          const auto at = static_cast<std::size_t>(r * ld + t);
          const float product = x[at] * s;
          const float expected = t < n ? portable::exp_float(product - shift) : x[at];
          ASSERT_EQ(std::bit_cast<std::uint32_t>(got[at]), std::bit_cast<std::uint32_t>(expected))
              << rows << " rows of " << n << ", row " << r << " entry " << t;
        }
        EXPECT_EQ(sums[static_cast<std::size_t>(r)], portable::sum_widened(got.data() + r * ld, n))
            << rows << " rows of " << n << ", row " << r;
      }
    }
  }
}

// exp_floats_sums computes rows whose arguments are at most 0 by a shorter form of exp_float
// (one product for 2^n), and falls back to exp_float itself for a row with an argument above 0 or
// NaN. Both must give exp_float's bits: a float in every 263 from -0 down past the underflow
// bound (-87.34), where the results reach 2^-126 (n = -126) and then 0, and every float near the
// bound; and rows holding 0, -0, the bound's neighbours, -inf, a positive argument, +inf and NaN.
TEST(PortableMath, ExpFloatsSumsAreExpFloatOverTheNonPositiveFloatsAndTheFallbacks) {
  std::vector<float> x;
  const std::uint32_t top = std::bit_cast<std::uint32_t>(-0.0F), bottom = std::bit_cast<std::uint32_t>(-88.0F);
  for (std::uint32_t b = top; b <= bottom; b += 263) x.push_back(std::bit_cast<float>(b));
  for (float v = -87.3366F; v < -87.3364F; v = std::nextafter(v, 0.0F)) x.push_back(v);  // around kLo
  const auto n = static_cast<Eigen::Index>(x.size());
  std::vector<float> got = x;
  double sum = -1.0;
  const float shift = 0.0F;
  portable::exp_floats_sums(got.data(), n, 1, n, 1.0F, &shift, &sum);
  std::size_t lowest = 0, zeros = 0;
  for (std::size_t t = 0; t < x.size(); ++t) {
    const float want = portable::exp_float(x[t]);
    lowest += want > 0.0F && want < 0x1p-125F ? 1 : 0;
    zeros += want == 0.0F ? 1 : 0;
    ASSERT_EQ(std::bit_cast<std::uint32_t>(got[t]), std::bit_cast<std::uint32_t>(want)) << "exp of " << x[t];
  }
  EXPECT_GT(lowest, 10u);  // the sweep reached n = -126, the smallest results
  EXPECT_GT(zeros, 10u);   // and the arguments below the bound
  EXPECT_EQ(sum, portable::sum_widened(got.data(), n));

  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::vector<float>> specials = {
      {0.0F, -0.0F, -87.336544F, std::nextafter(-87.336544F, 0.0F), std::nextafter(-87.336544F, -inf), -inf, -1e30F},
      {-1.0F, 0.5F, -3.0F},          // one argument above 0: the fallback
      {-1.0F, inf, -2.0F, 88.7F, 89.0F},  // +inf and the overflow bound
      {-1.0F, nan, -2.0F}};          // NaN
  for (const std::vector<float>& row0 : specials) {
    for (const Eigen::Index reps : {1, 3, 7}) {  // rows of 3 to 35 entries: whole blocks and ends
      std::vector<float> row;
      for (Eigen::Index r = 0; r < reps; ++r) row.insert(row.end(), row0.begin(), row0.end());
      std::vector<float> out = row;
      double row_sum = 0.0;
      const auto m = static_cast<Eigen::Index>(row.size());
      portable::exp_floats_sums(out.data(), m, 1, m, 1.0F, &shift, &row_sum);
      for (std::size_t t = 0; t < row.size(); ++t) {
        const float want = portable::exp_float(row[t]);
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(out[t])) << "exp of " << row[t];
        } else {
          EXPECT_EQ(std::bit_cast<std::uint32_t>(out[t]), std::bit_cast<std::uint32_t>(want)) << "exp of " << row[t];
        }
      }
    }
  }
}

// max_scaled passes over NaN products wherever they stand: the largest of the others, the same
// on every vector width (it used to drop the running maximum at a NaN); -inf where all are NaN.
TEST(PortableMath, MaxScaledPassesOverNaNProducts) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::mt19937_64 gen(11);
  std::normal_distribution<float> z(0.0F, 30.0F);
  for (const Eigen::Index n : {1, 7, 16, 17, 33, 64, 65, 197}) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (float& v : x) v = z(gen);
    for (Eigen::Index p = 0; p < n; ++p) {
      for (const Eigen::Index stride : {Eigen::Index{1}, Eigen::Index{5}}) {  // one NaN, or one in every five
        std::vector<float> y = x;
        float top = -HUGE_VALF;
        for (Eigen::Index t = 0; t < n; ++t) {
          if (t >= p && (t - p) % stride == 0 && (stride > 1 || t == p)) {
            y[static_cast<std::size_t>(t)] = nan;
          } else {
            top = std::max(top, y[static_cast<std::size_t>(t)] * 0.25F);
          }
        }
        EXPECT_EQ(portable::max_scaled(y.data(), n, 0.25F), top) << "n = " << n << ", NaN from " << p << " every " << stride;
      }
    }
    const std::vector<float> all(static_cast<std::size_t>(n), nan);
    EXPECT_EQ(portable::max_scaled(all.data(), n, 1.0F), -HUGE_VALF) << "n = " << n;
  }
}

// softmax_exps: the tops max_scaled's, every entry and sum exp_floats_sums' with those shifts, bit
// for bit (NaN payloads included), the logits the arguments fl(fl(x s) - top), the entries
// between rows untouched; true unless a top or a sum is not finite. Random rows of awkward
// lengths, and rows holding NaN, +-inf, a product that overflows, and nothing but NaN.
TEST(PortableMath, SoftmaxExpsAreExpFloatsSumsShiftedByTheRowsMaxima) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const auto bits = [](float v) { return std::bit_cast<std::uint32_t>(v); };
  std::mt19937_64 gen(12);
  std::normal_distribution<float> z(0.0F, 20.0F);
  for (const Eigen::Index rows : {1, 2, 3, 4, 5, 9}) {
    for (const Eigen::Index n : {1, 5, 16, 17, 63, 197, 200}) {
      for (const int special : {0, 1, 2, 3, 4}) {  // none; a NaN; +inf; an overflowing product; all NaN
        const Eigen::Index ld = n + 3;
        const float s = special == 3 ? 4.0F : 0.3F;
        std::vector<float> x(static_cast<std::size_t>(rows * ld));
        for (float& v : x) v = z(gen);
        const Eigen::Index r_special = rows / 2;
        float* row = x.data() + r_special * ld;
        if (special == 1) row[n / 2] = nan;
        if (special == 2) row[n - 1] = inf, row[0] = -inf;
        if (special == 3) row[n / 3] = 3e38F;  // finite, but its product by 4 is +inf
        if (special == 4) std::fill(row, row + n, nan);
        std::vector<float> shifts(static_cast<std::size_t>(rows));
        bool finite = true;
        for (Eigen::Index r = 0; r < rows; ++r) {
          shifts[static_cast<std::size_t>(r)] = portable::max_scaled(x.data() + r * ld, n, s);
          finite = finite && std::isfinite(shifts[static_cast<std::size_t>(r)]);
        }
        std::vector<float> want = x;
        std::vector<double> want_sums(static_cast<std::size_t>(rows));
        portable::exp_floats_sums(want.data(), ld, rows, n, s, shifts.data(), want_sums.data());
        for (const double sum : want_sums) finite = finite && std::isfinite(sum);
        EXPECT_EQ(finite, special == 0) << "every special row has a top or a sum that is not finite";

        std::vector<float> got = x, tops(static_cast<std::size_t>(rows), -1.0F);
        std::vector<float> logits(static_cast<std::size_t>(rows * n), -1.0F);
        std::vector<double> sums(static_cast<std::size_t>(rows), -1.0);
        const std::string what = std::to_string(rows) + " rows of " + std::to_string(n) + ", case " + std::to_string(special);
        EXPECT_EQ(portable::softmax_exps(got.data(), ld, rows, n, s, tops.data(), sums.data(), logits.data(), n), finite)
            << what;
        for (Eigen::Index r = 0; r < rows; ++r) {
          const auto ur = static_cast<std::size_t>(r);
          ASSERT_EQ(bits(tops[ur]), bits(shifts[ur])) << what << ", row " << r;
          ASSERT_EQ(std::bit_cast<std::uint64_t>(sums[ur]), std::bit_cast<std::uint64_t>(want_sums[ur])) << what << ", row " << r;
          for (Eigen::Index t = 0; t < ld; ++t) {
            const auto at = static_cast<std::size_t>(r * ld + t);
            ASSERT_EQ(bits(got[at]), bits(want[at])) << what << ", row " << r << " entry " << t;
            if (t < n) {
              const float arg = x[at] * s - shifts[ur];
              ASSERT_EQ(bits(logits[static_cast<std::size_t>(r * n + t)]), bits(arg)) << what << ", row " << r << " entry " << t;
            }
          }
        }
        // And without logits: the same rows.
        std::vector<float> again = x;
        portable::softmax_exps(again.data(), ld, rows, n, s, tops.data(), sums.data());
        EXPECT_EQ(std::memcmp(again.data(), got.data(), got.size() * sizeof(float)), 0) << what;
      }
    }
  }
}

// softmax_exps' exponentials one by one against exp_float itself, over every kind of argument at
// most 0: a row holding 0 has the top 0 at s = 1, so its arguments are its entries exactly. The
// arguments: every float from the underflow clamp's neighbours up to 0 on a fine grid, the clamp
// and its neighbour floats, arguments whose results are subnormal (flushed to 0), -0, the
// smallest subnormals, the reduction's half-ln2 boundaries, -inf and NaN; in rows whose lengths
// end on every register count of the vector paths (AVX2 + FMA: four registers at a time, then
// one; the rest through the rows' gathered tails).
TEST(PortableMath, SoftmaxExpsAreExpFloatOnEveryKindOfArgument) {
  const float lo = -87.336544F, nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> args = {-0.0F, 0.0F, -1e-45F, -1e-40F, -1e-30F, -1e-8F, -0.34657359F, -0.34657362F,
                             -1.0397208F, -std::numeric_limits<float>::infinity(), nan, -87.0F, -87.5F, -88.0F,
                             -100.0F, -103.0F, -104.0F, -1e30F, -std::numeric_limits<float>::max()};
  for (int k = -64; k <= 64; ++k) {  // the clamp's 129 neighbours
    float v = lo;
    for (int step = 0; step < std::abs(k); ++step) v = std::nextafter(v, k < 0 ? -HUGE_VALF : 0.0F);
    args.push_back(v);
  }
  for (int i = 0; i <= 20000; ++i) args.push_back(-90.0F * static_cast<float>(i) / 20000.0F);
  const auto bits = [](float v) { return std::bit_cast<std::uint32_t>(v); };
  for (const Eigen::Index n : {8, 15, 16, 24, 31, 32, 33, 40, 47, 48, 56, 64, 72, 197}) {
    const Eigen::Index per_row = n - 1, rows = (static_cast<Eigen::Index>(args.size()) + per_row - 1) / per_row;
    std::vector<float> x(static_cast<std::size_t>(rows * n), -1.0F);
    for (Eigen::Index r = 0; r < rows; ++r) {
      x[static_cast<std::size_t>(r * n + (r % n))] = 0.0F;  // the top, moved along the row
      Eigen::Index t = 0;
      for (Eigen::Index i = r * per_row; i < std::min<Eigen::Index>((r + 1) * per_row, args.size()); ++i, ++t) {
        if (t == r % n) ++t;
        x[static_cast<std::size_t>(r * n + t)] = args[static_cast<std::size_t>(i)];
      }
    }
    std::vector<float> got = x, tops(static_cast<std::size_t>(rows)), logits(x.size());
    std::vector<double> sums(static_cast<std::size_t>(rows));
    portable::softmax_exps(got.data(), n, rows, n, 1.0F, tops.data(), sums.data(), logits.data(), n);
    std::vector<float> again = x;
    portable::softmax_exps(again.data(), n, rows, n, 1.0F, tops.data(), sums.data());
    for (std::size_t at = 0; at < x.size(); ++at) {
      const float arg = x[at] * 1.0F - tops[at / static_cast<std::size_t>(n)];  // the top: +0 or -0
      ASSERT_EQ(bits(logits[at]), bits(arg)) << "n " << n << ", argument " << x[at];
      ASSERT_EQ(bits(got[at]), bits(portable::exp_float(arg))) << "n " << n << ", argument " << x[at];
      ASSERT_EQ(bits(again[at]), bits(got[at])) << "n " << n << ", argument " << x[at];
    }
    for (Eigen::Index r = 0; r < rows; ++r) EXPECT_EQ(tops[static_cast<std::size_t>(r)], 0.0F) << "n " << n << ", row " << r;
  }
}

/// The documented order, one output at a time: c_ij = fma(a_it, b_jt, c) for t = 0, 1, ...
template <typename T>
std::vector<T> reference_nt(const std::vector<T>& a, const std::vector<T>& b, Eigen::Index m, Eigen::Index n,
                            Eigen::Index k) {
  std::vector<T> c(static_cast<std::size_t>(m * n));
  for (Eigen::Index i = 0; i < m; ++i)
    for (Eigen::Index j = 0; j < n; ++j) {
      T s = T(0);
      for (Eigen::Index t = 0; t < k; ++t) {
        s = std::fma(a[static_cast<std::size_t>(i * k + t)], b[static_cast<std::size_t>(j * k + t)], s);
      }
      c[static_cast<std::size_t>(i * n + j)] = s;
    }
  return c;
}

template <typename T>
void check_products(double magnitude) {
  std::mt19937_64 gen(3);
  std::normal_distribution<double> z(0.0, 1.0);
  for (const Eigen::Index m : {1, 5, 6, 7, 13, 63, 197})
    for (const Eigen::Index n : {1, 3, 17, 33, 197})
      for (const Eigen::Index k : {1, 7, 64}) {
        std::vector<T> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(n * k));
        for (T& x : a) x = static_cast<T>(z(gen) * magnitude);
        for (T& x : b) x = static_cast<T>(z(gen) * magnitude);
        const std::vector<T> want = reference_nt(a, b, m, n, k);
        const std::string where = "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" +
                                  std::to_string(k) + " magnitude=" + std::to_string(magnitude);
        std::vector<T> c(static_cast<std::size_t>(m * n), T(-1));
        portable::gemm_nt(a.data(), k, b.data(), k, c.data(), n, m, n, k);
        for (std::size_t i = 0; i < c.size(); ++i) {
          ASSERT_EQ(c[i], want[i]) << "gemm_nt " << where << " entry " << i;
        }
        // gemm_nn of A and B^T (B^T stored k x n): the same numbers, the same order.
        std::vector<T> bt(static_cast<std::size_t>(k * n));
        for (Eigen::Index j = 0; j < n; ++j)
          for (Eigen::Index t = 0; t < k; ++t) bt[static_cast<std::size_t>(t * n + j)] = b[static_cast<std::size_t>(j * k + t)];
        std::fill(c.begin(), c.end(), T(-1));
        portable::gemm_nn(a.data(), k, Eigen::Index{1}, bt.data(), n, c.data(), n, m, n, k);
        for (std::size_t i = 0; i < c.size(); ++i) ASSERT_EQ(c[i], want[i]) << "gemm_nn " << where << " entry " << i;
        // A given transposed (column strides): A^T stored k x m.
        std::vector<T> at(static_cast<std::size_t>(k * m));
        for (Eigen::Index i = 0; i < m; ++i)
          for (Eigen::Index t = 0; t < k; ++t) at[static_cast<std::size_t>(t * m + i)] = a[static_cast<std::size_t>(i * k + t)];
        std::fill(c.begin(), c.end(), T(-1));
        portable::gemm_nn(at.data(), Eigen::Index{1}, m, bt.data(), n, c.data(), n, m, n, k);
        for (std::size_t i = 0; i < c.size(); ++i) ASSERT_EQ(c[i], want[i]) << "gemm_nn (A^T) " << where;
      }
}

// The widened sums in vectors: bit for bit lane_sum of the same terms, for one row and for many
// rows at once (every count of rows around the kernel's group sizes), on lengths around the
// lanes, magnitudes from subnormal to huge, and mixed signs. A sum in another order is told
// apart (negative control), so the comparison sees the order.
TEST(PortableMath, WidenedSumsAreLaneSumBitForBit) {
  std::mt19937_64 gen(19);
  std::normal_distribution<float> z(0.0F, 1.0F);
  std::uniform_int_distribution<int> exponent(-140, 60);
  bool order_seen = false;
  for (const Eigen::Index n : {0, 1, 5, 15, 16, 17, 31, 32, 33, 64, 65, 197, 200}) {
    for (const Eigen::Index rows : {1, 2, 3, 4, 5, 7, 8, 9, 13}) {
      const Eigen::Index ld = n + 3;
      std::vector<float> x(static_cast<std::size_t>(rows * ld + 1)), y(static_cast<std::size_t>(n + 1));
      for (float& v : x) v = std::ldexp(z(gen), exponent(gen) / 4);
      for (float& v : y) v = std::ldexp(z(gen), exponent(gen) / 4);
      if (n > 3) x[2] = std::ldexp(1.0F, -140);  // a subnormal term
      std::vector<double> squares(static_cast<std::size_t>(rows)), distances(squares.size()), dots(squares.size());
      portable::sums_of_squares(x.data(), ld, rows, n, squares.data());
      portable::distances2(x.data(), ld, rows, y.data(), n, distances.data());
      std::vector<float> float_distances(static_cast<std::size_t>(rows)), float_squares(float_distances.size());
      portable::distances2_float(x.data(), ld, rows, y.data(), n, float_distances.data());
      portable::sums_of_squares_float(x.data(), ld, rows, n, float_squares.data());
      // Each row against the row after it (x's rows overlap y's: y_ld = ld).
      portable::dots_widened(x.data(), ld, x.data() + 1, ld, rows, n, dots.data());
      std::vector<double> yd(y.begin(), y.end());
      for (Eigen::Index r = 0; r < rows; ++r) {
        const float* a = x.data() + r * ld;
        const double want_widened = lane_sum(n, [a](Eigen::Index t) { return static_cast<double>(a[t]); });
        const double want_square = lane_sum(n, [a](Eigen::Index t) {
          const auto v = static_cast<double>(a[t]);
          return v * v;
        });
        const double want_distance = lane_sum(n, [a, &y](Eigen::Index t) {
          const double diff = static_cast<double>(a[t]) - static_cast<double>(y[static_cast<std::size_t>(t)]);
          return diff * diff;
        });
        const std::string at = "n = " + std::to_string(n) + " rows = " + std::to_string(rows) + " r = " + std::to_string(r);
        EXPECT_EQ(portable::sum_widened(a, n), want_widened) << at;
        EXPECT_EQ(portable::sum_of_squares(a, n), want_square) << at;
        EXPECT_EQ(portable::distance2(a, y.data(), n), want_distance) << at;
        const double want_dot = lane_sum(n, [a](Eigen::Index t) {
          return static_cast<double>(a[t]) * static_cast<double>(a[t + 1]);
        });
        const double want_dot_double = lane_sum(n, [a, &yd](Eigen::Index t) {
          return static_cast<double>(a[t]) * yd[static_cast<std::size_t>(t)];
        });
        EXPECT_EQ(dots[static_cast<std::size_t>(r)], want_dot) << at;
        // The float distances: lane_sum's order with float lanes, written out plainly.
        std::array<float, kLanes> lanes{};
        Eigen::Index t = 0;
        for (; t + kLanes <= n; t += kLanes) {
          for (int l = 0; l < kLanes; ++l) {
            const float diff = a[t + l] - y[static_cast<std::size_t>(t + l)];
            lanes[static_cast<std::size_t>(l)] += diff * diff;
          }
        }
        float want_float = 0.0F;
        for (; t < n; ++t) {
          const float diff = a[t] - y[static_cast<std::size_t>(t)];
          want_float += diff * diff;
        }
        static_assert(kLanes == 16, "written_tree writes out sixteen lanes");
        want_float = want_float + written_tree(lanes);
        EXPECT_EQ(float_distances[static_cast<std::size_t>(r)], want_float) << at;
        // The float squares by fused steps: the same order with std::fma, and within gamma_n of
        // the double sum plus the underflow term (confusion's norm bounds rest on it).
        std::array<float, kLanes> square_lanes{};
        for (t = 0; t + kLanes <= n; t += kLanes) {
          for (int l = 0; l < kLanes; ++l) {
            float& lane = square_lanes[static_cast<std::size_t>(l)];
            lane = std::fma(a[t + l], a[t + l], lane);
          }
        }
        float want_squares = 0.0F;
        for (; t < n; ++t) want_squares = std::fma(a[t], a[t], want_squares);
        want_squares = want_squares + written_tree(square_lanes);
        EXPECT_EQ(float_squares[static_cast<std::size_t>(r)], want_squares) << at;
        if (std::isfinite(want_squares)) {
          const double nu = static_cast<double>(n) * 0x1.0p-24;
          EXPECT_LE(std::abs(static_cast<double>(want_squares) - want_square),
                    nu / (1.0 - nu) * want_square + static_cast<double>(n) * 0x1.0p-149)
              << at;
        }
        EXPECT_EQ(portable::dot_widened(a, yd.data(), n), want_dot_double) << at;
        EXPECT_EQ(squares[static_cast<std::size_t>(r)], want_square) << at;
        EXPECT_EQ(distances[static_cast<std::size_t>(r)], want_distance) << at;
        double chain = 0.0;  // one running sum in index order
        for (Eigen::Index u = 0; u < n; ++u) chain += static_cast<double>(a[u]);
        order_seen = order_seen || chain != want_widened;
      }
    }
  }
  EXPECT_TRUE(order_seen) << "no case where the order of the sum changes it: the comparison would not see a wrong order";
  // Entries above about 1.8e19 overflow the float squares: +inf, which the norm bounds replace by
  // the double sum.
  const std::vector<float> big(20, 1e20F);
  float big_squares = 0.0F;
  portable::sums_of_squares_float(big.data(), 20, 1, 20, &big_squares);
  EXPECT_EQ(big_squares, HUGE_VALF);
  EXPECT_EQ(portable::sum_of_squares(big.data(), 20), 20.0 * static_cast<double>(1e20F) * static_cast<double>(1e20F));
}

TEST(PortableMath, ProductsAreTheDocumentedOrderBitForBit) {
  check_products<float>(1.0);
  check_products<double>(1.0);
  check_products<float>(1e18);   // huge: products near float's range
  check_products<double>(1e-160);  // tiny: products underflow into subnormals
  check_products<double>(1e150);
}

/// transpose into float and double: every value moved bit for bit (NaN payloads, signed zeros,
/// subnormals, infinities), nothing written outside the transposed rectangle.
template <typename Out>
void check_transpose(const std::vector<float>& pool) {
  using Bits = std::conditional_t<sizeof(Out) == 4, std::uint32_t, std::uint64_t>;
  const Out sentinel = static_cast<Out>(-12345.0F);
  for (Eigen::Index rows : {1, 3, 7, 8, 9, 16, 17, 64, 197})
    for (Eigen::Index cols : {1, 5, 8, 15, 16, 24, 64}) {
      const Eigen::Index ldi = cols + 3, ldo = rows + 2;
      std::vector<float> in(static_cast<std::size_t>(rows * ldi));
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = pool[(i * 7919) % pool.size()];
      std::vector<Out> out(static_cast<std::size_t>(cols * ldo), sentinel);
      portable::transpose(in.data(), ldi, rows, cols, out.data(), ldo);
      for (Eigen::Index c = 0; c < cols; ++c) {
        for (Eigen::Index r = 0; r < rows; ++r) {
          const Out want = static_cast<Out>(in[static_cast<std::size_t>(r * ldi + c)]);
          ASSERT_EQ(std::bit_cast<Bits>(out[static_cast<std::size_t>(c * ldo + r)]), std::bit_cast<Bits>(want))
              << rows << " x " << cols << " at " << r << ", " << c;
        }
        for (Eigen::Index r = rows; r < ldo; ++r) {
          ASSERT_EQ(out[static_cast<std::size_t>(c * ldo + r)], sentinel) << "wrote past row " << rows;
        }
      }
    }
}

TEST(PortableMath, TransposesMoveEveryValueUnchanged) {
  std::vector<float> pool = {0.0F, -0.0F, 1.0F, -2.5F, 0x1p-140F, -0x1p-149F, HUGE_VALF, -HUGE_VALF,
                             std::bit_cast<float>(0x7fc01234U), std::numeric_limits<float>::max()};
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.0F, 3.0F);
  for (int i = 0; i < 997; ++i) pool.push_back(normal(gen));
  check_transpose<float>(pool);
  check_transpose<double>(pool);
}

TEST(PortableMath, EigenWrappersCheckLayouts) {
  MatD a = MatD::Random(9, 4), b = MatD::Random(11, 4), c(9, 11);
  portable::product_nt(a, b, c);
  EXPECT_LT((c - a * b.transpose()).cwiseAbs().maxCoeff(), 1e-14);
  MatD d(4, 11);
  portable::product(a.transpose(), c, d);
  EXPECT_LT((d - a.transpose() * c).cwiseAbs().maxCoeff(), 1e-13);
  MatD wrong(3, 3);
  EXPECT_THROW(portable::product_nt(a, b, wrong), std::logic_error);
  EXPECT_THROW(portable::product(a, b, wrong), std::logic_error);
}

TEST(PortableMath, NoSourceContractsMultiplyAdd) {
  // a b = 1 + 2^-26 + 2^-54: rounded, the 2^-54 is lost and a b + c = 0; fused, it is kept.
  volatile double a = 1.0 + 0x1p-27, b = 1.0 + 0x1p-27, c = -(1.0 + 0x1p-26);
  const double fused = std::fma(a, b, c);
  ASSERT_EQ(fused, 0x1p-54) << "negative control: the fused result differs";
  EXPECT_EQ(portable::probe::portable_math(a, b, c), 0.0) << "portable_math.cpp contracts a * b + c";
  EXPECT_EQ(portable::probe::confusion_softmax(a, b, c), 0.0) << "confusion_softmax.cpp contracts a * b + c";
  EXPECT_EQ(portable::probe::confusion_lowrank(a, b, c), 0.0) << "confusion_lowrank.cpp contracts a * b + c";
  EXPECT_EQ(portable::probe::candidate_margin(a, b, c), 0.0)
      << "confusion_cuda.cpp contracts a * b + c";
  // This test's own file is compiled with the project's flags too.
  EXPECT_EQ(a * b + c, 0.0);
}

TEST(PortableMath, EigenIsNeitherVectorisedNorThreaded) {
#ifndef EIGEN_DONT_VECTORIZE
  ADD_FAILURE() << "EIGEN_DONT_VECTORIZE is not set: Eigen's reductions depend on the vector width";
#endif
#ifndef EIGEN_DONT_PARALLELIZE
  ADD_FAILURE() << "EIGEN_DONT_PARALLELIZE is not set: Eigen's blocking depends on the thread count";
#endif
  EXPECT_EQ(Eigen::internal::packet_traits<double>::Vectorizable, 0);
  std::ptrdiff_t l1 = 0, l2 = 0, l3 = 0;
  Eigen::internal::manage_caching_sizes(Eigen::GetAction, &l1, &l2, &l3);
  EXPECT_EQ(l1, 32 * 1024) << "the blocking is fixed before main (fix_eigen_blocking)";
  EXPECT_EQ(l2, 1024 * 1024);
  EXPECT_EQ(l3, 8 * 1024 * 1024);
}

}  // namespace
}  // namespace attnscope
