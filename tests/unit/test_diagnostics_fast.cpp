// The float softmax path of `distance` and `entropy` (analyses/src/float_softmax_rows.hpp) against
// the double references: measured errors on DeiT-T-shaped heads below a named tolerance far
// inside the proven bound; heads outside the float range (large |q| |k|) take the double path and
// agree with the reference to double precision; a thread's buffers reused across head sizes
// give the same bits as fresh ones; a sink threshold within the float error of a weight is
// decided on the double path.
#include "attnscope/analyses/distance.hpp"
#include "attnscope/analyses/entropy.hpp"
#include "attnscope/analyses/sinks.hpp"
#include "attnscope/attention.hpp"
#include "float_rows_bound.hpp"
#include "random_inputs.hpp"
#include "tolerances.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>
#include <vector>

namespace attnscope::analyses {
namespace {

/// What the float path gives on DeiT-T-shaped heads (unit-variance q and k, s = d^-1/2): the
/// proven bound (about 1e-5 there) allows more; rounding errors of the GEMM mostly cancel.
constexpr double kMeasuredFloatTol = 1e-6;
/// The same for single weights, relative (the worst on these heads: 1.5e-6).
constexpr double kMeasuredWeightTol = 4e-6;

struct Head {
  MatF q, k;
  double scale;
};

Head head(const TokenGrid& g, int d, std::uint64_t seed, double magnitude) {
  return {(magnitude * test::random_matrix(g.tokens(), d, seed)).cast<float>(),
          (magnitude * test::random_matrix(g.tokens(), d, seed + 1)).cast<float>(),
          1.0 / std::sqrt(static_cast<double>(d))};
}

std::string config(const TokenGrid& g, int d, double magnitude) {
  return "softmax grid=" + std::to_string(g.prefix) + "+" + std::to_string(g.height) + "x" +
         std::to_string(g.width) + " d=" + std::to_string(d) + " |q|,|k| x" +
         std::to_string(magnitude);
}

const TokenGrid kGrids[] = {{1, 14, 14}, {0, 7, 9}, {1, 1, 1}, {0, 1, 1}};

TEST(DiagnosticsFloat, DistanceWithinMeasuredToleranceOfReference) {
  const Variant v = parse_variant("softmax");
  // The grids above and one of more than PatchGeometry::kCellTableCells cells (the query's
  // distances assembled row by row instead of read from the cell table).
  std::vector<TokenGrid> grids(std::begin(kGrids), std::end(kGrids));
  grids.push_back({0, 25, 24});
  for (const TokenGrid& g : grids) {
    for (int d : {1, 60, 64}) {
      const Head h = head(g, d, 40 + static_cast<std::uint64_t>(d), 1.0);
      const std::string what = config(g, d, 1.0);
      ASSERT_TRUE(test::float_rows_bound(v, h.q, h.k, h.scale).used) << what;
      const PatchGeometry geo(g, 16.0, 16.0);
      for (bool renormalise : {false, true}) {
        const DistanceRows fast = attention_distance(v, h.q, h.k, h.scale, geo, {renormalise});
        const DistanceRows ref =
            attention_distance_reference(v, h.q, h.k, h.scale, geo, {renormalise});
        EXPECT_EQ(fast.without_grid_mass, ref.without_grid_mass) << what;
        for (std::size_t i = 0; i < fast.distance.size(); ++i) {
          ASSERT_EQ(std::isnan(fast.distance[i]), std::isnan(ref.distance[i])) << what << " " << i;
          if (std::isnan(ref.distance[i])) continue;
          EXPECT_NEAR(fast.distance[i], ref.distance[i],
                      kMeasuredFloatTol * std::max(1.0, std::abs(ref.distance[i])))
              << what << (renormalise ? " renormalised" : "") << " token " << i;
          EXPECT_NEAR(fast.grid_mass[i], ref.grid_mass[i], kMeasuredFloatTol) << what << " " << i;
        }
      }
    }
  }
}

TEST(DiagnosticsFloat, EntropyWithinMeasuredToleranceOfReference) {
  const Variant v = parse_variant("softmax");
  for (const TokenGrid& g : kGrids) {
    for (int d : {1, 60, 64}) {
      const Head h = head(g, d, 50 + static_cast<std::uint64_t>(d), 1.0);
      const std::string what = config(g, d, 1.0);
      ASSERT_TRUE(test::float_rows_bound(v, h.q, h.k, h.scale).used) << what;
      const EntropyRows fast = attention_entropy(v, h.q, h.k, h.scale, {});
      const EntropyRows ref = attention_entropy_reference(v, h.q, h.k, h.scale, {});
      for (std::size_t i = 0; i < fast.entropy.size(); ++i) {
        EXPECT_NEAR(fast.entropy[i], ref.entropy[i], kMeasuredFloatTol) << what << " row " << i;
        EXPECT_EQ(fast.negative_mass[i], 0.0) << what << " row " << i;
      }
    }
  }
}

// Large |q| |k| (logit error bound above 2^-12) and extreme magnitudes: the double path, equal to
// the reference to double precision. A negative control for the float range test: at these
// magnitudes the float rows would be off by far more than kDoubleTol.
TEST(DiagnosticsFloat, OutsideTheFloatRangeTheDoublePathRuns) {
  const Variant v = parse_variant("softmax");
  const TokenGrid g{1, 14, 14};
  const PatchGeometry geo(g, 16.0, 16.0);
  for (double magnitude : {8.0, 1e3, 1e15}) {
    const Head h = head(g, 64, 70, magnitude);
    const std::string what = config(g, 64, magnitude);
    ASSERT_FALSE(test::float_rows_bound(v, h.q, h.k, h.scale).used) << what;
    const DistanceRows fast = attention_distance(v, h.q, h.k, h.scale, geo, {});
    const DistanceRows ref = attention_distance_reference(v, h.q, h.k, h.scale, geo, {});
    const EntropyRows fe = attention_entropy(v, h.q, h.k, h.scale, {});
    const EntropyRows re = attention_entropy_reference(v, h.q, h.k, h.scale, {});
    for (int i = g.prefix; i < g.tokens(); ++i) {
      const auto ui = static_cast<std::size_t>(i);
      EXPECT_NEAR(fast.distance[ui], ref.distance[ui],
                  test::kDoubleTol * g.tokens() * geo.max_distance())
          << what << " token " << i;
      EXPECT_NEAR(fe.entropy[ui], re.entropy[ui], test::kDoubleTol * std::log(197.0))
          << what << " row " << i;
    }
  }
}

// The float weights of `sinks` and `rollout` against the registry's double weights: within the
// proven bound 2 r / (1 - r) everywhere, and within kMeasuredWeightTol on these heads.
TEST(DiagnosticsFloat, WeightsWithinBoundOfTheDoubleWeights) {
  const Variant v = parse_variant("softmax");
  for (const TokenGrid& g : kGrids) {
    for (int d : {1, 60, 64}) {
      const Head h = head(g, d, 80 + static_cast<std::uint64_t>(d), 1.0);
      const std::string what = config(g, d, 1.0);
      MatD w;
      ASSERT_TRUE(detail::float_softmax_weights(h.q, h.k, h.scale, w)) << what;
      const MatD ref =
          attention_weights<double>(v, h.q.cast<double>(), h.k.cast<double>(), h.scale);
      const double rel = detail::relative_weight_error(detail::thread_float_softmax_rows().delta);
      ASSERT_EQ(w.rows(), ref.rows()) << what;
      double worst = 0.0;
      for (Eigen::Index i = 0; i < w.rows(); ++i) {
        for (Eigen::Index j = 0; j < w.cols(); ++j) {
          const double err = std::abs(w(i, j) - ref(i, j));
          EXPECT_LE(err, rel * ref(i, j) + 1e-37) << what << " (" << i << ", " << j << ")";
          worst = std::max(worst, err / ref(i, j));
          EXPECT_LE(err, kMeasuredWeightTol * ref(i, j) + 1e-37)
              << what << " (" << i << ", " << j << ")";
        }
      }
      if (g.tokens() > 1) {
        EXPECT_GT(worst, 0.0) << what << ": the float weights are not the double ones";
      }
    }
  }
}

// A threshold within the float weights' error of a key's smallest weight: the head is measured
// again in double, so the sink test agrees with the reference on both sides of that weight. (With
// the float weights alone, off by ~1e-6 relative, one of the two thresholds would be misjudged.)
TEST(DiagnosticsFloat, SinkTestNearTheThresholdIsTheExactOne) {
  const Variant v = parse_variant("softmax");
  const Head h = head(TokenGrid{1, 14, 14}, 64, 95, 1.0);
  ASSERT_TRUE(test::float_rows_bound(v, h.q, h.k, h.scale).used);
  const MatD w = attention_weights<double>(v, h.q.cast<double>(), h.k.cast<double>(), h.scale);
  for (Eigen::Index j : {Eigen::Index{0}, Eigen::Index{17}, Eigen::Index{196}}) {
    const double low = w.col(j).minCoeff();
    for (double factor : {1.0 - 1e-9, 1.0 + 1e-9}) {
      const double threshold = low * factor;
      const HeadSinks fast = head_sinks(v, h.q, h.k, h.scale, threshold);
      const HeadSinks ref = head_sinks_reference(v, h.q, h.k, h.scale, threshold);
      EXPECT_EQ(fast.sink_keys, ref.sink_keys) << "key " << j << " threshold " << threshold;
      const bool sink =
          std::find(ref.sink_keys.begin(), ref.sink_keys.end(), j) != ref.sink_keys.end();
      EXPECT_EQ(sink, factor < 1.0) << "key " << j << ": the reference's own test";
    }
  }
}

// One thread's buffers serve heads of every size: the same bits after a larger and a smaller head.
TEST(DiagnosticsFloat, ReusedBuffersGiveTheSameBits) {
  const Variant v = parse_variant("softmax");
  const TokenGrid big{1, 14, 14}, small{0, 7, 9};
  const Head h = head(big, 64, 90, 1.0), other = head(small, 60, 91, 1.0);
  const PatchGeometry geo(big, 16.0, 16.0), geo_small(small, 16.0, 16.0);
  const DistanceRows first = attention_distance(v, h.q, h.k, h.scale, geo, {});
  const EntropyRows first_e = attention_entropy(v, h.q, h.k, h.scale, {});
  (void)attention_distance(v, other.q, other.k, other.scale, geo_small, {});
  (void)attention_entropy(v, other.q, other.k, other.scale, {});
  const DistanceRows again = attention_distance(v, h.q, h.k, h.scale, geo, {});
  const EntropyRows again_e = attention_entropy(v, h.q, h.k, h.scale, {});
  for (std::size_t i = 1; i < first.distance.size(); ++i) {
    EXPECT_EQ(first.distance[i], again.distance[i]) << "token " << i;
    EXPECT_EQ(first_e.entropy[i], again_e.entropy[i]) << "row " << i;
  }
}

}  // namespace
}  // namespace attnscope::analyses
