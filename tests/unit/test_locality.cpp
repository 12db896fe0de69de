// Local mass: the fast paths (float softmax rows, low-rank window sums) against the double
// brute force on awkward grids, the uniform baseline, and the running statistics.
#include "attnscope/analyses/locality.hpp"
#include "attnscope/error.hpp"
#include "random_inputs.hpp"
#include "tolerances.hpp"
#include "variant_specs.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace attnscope::analyses {
namespace {

std::string config(const std::string& spec, const TokenGrid& g, int d, int window) {
  return spec + " grid=" + std::to_string(g.prefix) + "+" + std::to_string(g.height) + "x" +
         std::to_string(g.width) + " d=" + std::to_string(d) + " window=" + std::to_string(window);
}

TEST(Locality, FastMatchesBruteForce) {
  const TokenGrid grids[] = {{0, 1, 1}, {1, 1, 1}, {1, 7, 7}, {1, 14, 14}, {2, 5, 9}};
  for (const std::string& spec : test::all_variant_specs()) {
    for (const TokenGrid& g : grids) {
      for (int d : {1, 7, 64}) {
        for (int window : {1, 3, 5}) {
          const Variant v = parse_variant(spec, Convention::Paper, 4);
          const double mean = test::input_mean(v);
          const MatF q = test::random_matrix(g.tokens(), d, 17, mean).cast<float>();
          const MatF k = test::random_matrix(g.tokens(), d, 18, mean).cast<float>();
          const double scale = 1.0 / std::sqrt(static_cast<double>(d));
          int dead_fast = -1, dead_ref = -2;
          const auto fast = local_mass(v, q, k, scale, g, window, &dead_fast);
          const auto ref = local_mass_reference(v, q, k, scale, g, window, &dead_ref);
          const std::string what = config(spec, g, d, window);
          ASSERT_EQ(fast.size(), ref.size()) << what;
          EXPECT_EQ(dead_fast, dead_ref) << what;
          const double tol = v.linear_time_outputs() ? test::kDoubleTol : test::kFloatTol;
          for (std::size_t i = 0; i < fast.size(); ++i) {
            ASSERT_EQ(std::isnan(fast[i]), std::isnan(ref[i])) << what << " token " << i;
            if (std::isnan(ref[i])) continue;
            EXPECT_NEAR(fast[i], ref[i], tol * std::max(1.0, std::abs(ref[i]))) << what << " token " << i;
          }
          for (int i = 0; i < g.prefix; ++i) EXPECT_TRUE(std::isnan(fast[static_cast<std::size_t>(i)])) << what;
        }
      }
    }
  }
}

// relu@code with keys so small that the ReLU products sum to ~1e-15: rows sum well below 1 and the mass is
// that of the rows as computed (never renormalised), fast equal to the brute force.
TEST(Locality, RowsNotSummingToOneAreNotRenormalised) {
  const Variant v = parse_variant("relu@code");
  const TokenGrid g{1, 7, 7};
  for (int d : {1, 7, 64}) {
    const MatF q = test::random_matrix(g.tokens(), d, 27).cast<float>();
    const MatF k = (5e-15 / (g.tokens() * d) * test::random_matrix(g.tokens(), d, 28)).cast<float>();
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    int dead_fast = -1, dead_ref = -2;
    const auto fast = local_mass(v, q, k, scale, g, 3, &dead_fast);
    const auto ref = local_mass_reference(v, q, k, scale, g, 3, &dead_ref);
    const auto whole = local_mass(v, q, k, scale, g, 99, nullptr);  // every grid key
    const std::string what = config(v.name(), g, d, 3);
    EXPECT_EQ(dead_fast, dead_ref) << what;
    double smallest = 2.0;
    for (std::size_t i = 0; i < fast.size(); ++i) {
      ASSERT_EQ(std::isnan(fast[i]), std::isnan(ref[i])) << what << " token " << i;
      if (std::isnan(ref[i])) continue;
      EXPECT_NEAR(fast[i], ref[i], test::kDoubleTol * std::max(1.0, std::abs(ref[i]))) << what << " token " << i;
      smallest = std::min(smallest, whole[i]);
    }
    EXPECT_LT(smallest, 0.99) << what << ": control, some row's grid mass must stay below 1";
  }
}

// local_mass reads q and k in place (Eigen::Ref): a view of a caller's buffer (the Python module's
// Map of a numpy array), or of rows with a wider stride, gives the masses of the MatF bit for bit,
// float softmax rows, exact double rows (the large scale) and the low-rank form alike.
TEST(Locality, ViewsOfTheCallersBufferGiveTheMatFsMassesBitForBit) {
  const TokenGrid g{1, 7, 7};
  for (const std::string& spec : test::all_variant_specs()) {
    for (int d : {7, 64}) {
      for (double scale : {1.0 / std::sqrt(static_cast<double>(d)), 3e4}) {
        const Variant v = parse_variant(spec, Convention::Paper, 4);
        const double mean = test::input_mean(v);
        const MatF q = test::random_matrix(g.tokens(), d, 37, mean).cast<float>();
        const MatF k = test::random_matrix(g.tokens(), d, 38, mean).cast<float>();
        // The same values as rows of d + 3 floats, and as maps of a plain buffer.
        MatF q_wide = MatF::Constant(g.tokens(), d + 3, 1e30F), k_wide = q_wide;
        q_wide.leftCols(d) = q;
        k_wide.leftCols(d) = k;
        const Eigen::Ref<const MatF> q_strided = q_wide.leftCols(d), k_strided = k_wide.leftCols(d);
        ASSERT_EQ(q_strided.outerStride(), d + 3);  // a real stride, not a copy made by the Ref
        ASSERT_EQ(q_strided.data(), q_wide.data());
        const std::vector<float> q_buf(q.data(), q.data() + q.size()), k_buf(k.data(), k.data() + k.size());
        const Eigen::Map<const MatF> q_map(q_buf.data(), g.tokens(), d), k_map(k_buf.data(), g.tokens(), d);
        const std::string what = config(spec, g, d, 3) + " scale=" + std::to_string(scale);
        int dead = -1, dead_strided = -2, dead_map = -3;
        std::vector<double> mass, strided, mapped;
        try {
          mass = local_mass(v, q, k, scale, g, 3, &dead);
        } catch (const NumericalError&) {
          // Out of double's range for this family: the views must refuse it the same way.
          EXPECT_THROW(local_mass(v, q_strided, k_strided, scale, g, 3), NumericalError) << what;
          EXPECT_THROW(local_mass(v, q_map, k_map, scale, g, 3), NumericalError) << what;
          continue;
        }
        strided = local_mass(v, q_strided, k_strided, scale, g, 3, &dead_strided);
        mapped = local_mass(v, q_map, k_map, scale, g, 3, &dead_map);
        EXPECT_EQ(dead_strided, dead) << what;
        EXPECT_EQ(dead_map, dead) << what;
        ASSERT_EQ(strided.size(), mass.size()) << what;
        ASSERT_EQ(mapped.size(), mass.size()) << what;
        for (std::size_t i = 0; i < mass.size(); ++i) {
          ASSERT_EQ(std::isnan(strided[i]), std::isnan(mass[i])) << what << " token " << i;
          ASSERT_EQ(std::isnan(mapped[i]), std::isnan(mass[i])) << what << " token " << i;
          if (std::isnan(mass[i])) continue;
          EXPECT_EQ(strided[i], mass[i]) << what << " token " << i;
          EXPECT_EQ(mapped[i], mass[i]) << what << " token " << i;
        }
      }
    }
  }
}

TEST(Locality, IdenticalKeysGiveTheUniformMass) {
  const TokenGrid g{1, 6, 5};
  for (const char* spec : {"softmax", "linear:elu1", "inline", "mala"}) {
    const Variant v = parse_variant(spec);
    const MatF q = test::random_matrix(g.tokens(), 7, 5).cast<float>();
    const MatF k = test::random_matrix(1, 7, 6).cast<float>().replicate(g.tokens(), 1);
    const auto mass = local_mass(v, q, k, 0.4, g, 3);
    for (int i = g.prefix; i < g.tokens(); ++i) {
      const double want = static_cast<double>(g.window_size(i, 3)) / g.tokens();
      EXPECT_NEAR(mass[static_cast<std::size_t>(i)], want, test::kFloatTol) << spec << " token " << i;
    }
  }
}

TEST(Locality, UniformBaselineCountsClippedWindows) {
  // 14x14 grid, 3x3 windows: 144 interior cells of 9, 48 edge cells of 6, 4 corners of 4.
  const TokenGrid g{1, 14, 14};
  const double want = (144.0 * 9 + 48.0 * 6 + 4.0 * 4) / 196.0 / 197.0;
  EXPECT_NEAR(uniform_baseline(g, 3), want, 1e-15);
  EXPECT_NEAR(uniform_baseline(TokenGrid{1, 1, 1}, 3), 1.0 / 2.0, 1e-15);
}

TEST(Locality, EvenWindowIsAUsageError) {
  const TokenGrid g{1, 3, 3};
  const MatF q = MatF::Ones(10, 2);
  EXPECT_THROW((void)local_mass(parse_variant("softmax"), q, q, 1.0, g, 2), UsageError);
}

TEST(RunningStats, MergeEqualsOnePass) {
  const MatD x = test::random_matrix(1, 101, 3);
  RunningStats all, left, right;
  for (Eigen::Index i = 0; i < x.cols(); ++i) (i < 40 ? left : right).add(x(0, i)), all.add(x(0, i));
  left.merge(right);
  const double mean = x.mean();
  const double sd = std::sqrt((x.array() - mean).square().mean());
  EXPECT_EQ(left.count, 101);
  EXPECT_NEAR(left.mean, mean, 1e-14);
  EXPECT_NEAR(left.stddev(), sd, 1e-14);
  EXPECT_NEAR(all.stddev(), sd, 1e-14);
  EXPECT_EQ(left.min, x.minCoeff());
  EXPECT_EQ(left.max, x.maxCoeff());
}

}  // namespace
}  // namespace attnscope::analyses
