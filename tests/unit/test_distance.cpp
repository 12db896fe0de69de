// Mean attention distance: the fast path (registry weights, distance table) against the plain
// reference (ExactRows, coordinates) and against the registry-free reference weights, on awkward
// grids and every family; one-hot rows give the exact grid distance; prefix tokens are dropped
// (negative controls that fail if CLS were a grid cell or a key of the sum); uniform rows give
// the uniform baseline; the averaging is over queries, then images.
#include "attnscope/analyses/distance.hpp"
#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"
#include "float_rows_bound.hpp"
#include "random_inputs.hpp"
#include "reference.hpp"
#include "tolerances.hpp"
#include "variant_specs.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>

namespace attnscope::analyses {
namespace {

/// Float to double element by element. (Eigen's q.cast<double>() as a function argument was seen
/// to give values one float ulp off under GCC 12 -O3 -march=native in a test TU: see the report.)
MatD to_double(const MatF& x) {
  MatD out(x.rows(), x.cols());
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    for (Eigen::Index j = 0; j < x.cols(); ++j) out(i, j) = static_cast<double>(x(i, j));
  }
  return out;
}

/// Fast vs reference: a few ulps of the largest term. Signed weights (InLine and MALA in the paper
/// convention reach |w| ~ 30) cancel, so the bound is relative to the row's sum of |w_ij| d_ij,
/// which the test bounds by max |w| * N * max distance.
constexpr double kDistanceTol = test::kDoubleTol;

std::string config(const std::string& spec, const TokenGrid& g, int d, bool renormalise) {
  return spec + " grid=" + std::to_string(g.prefix) + "+" + std::to_string(g.height) + "x" +
         std::to_string(g.width) + " d=" + std::to_string(d) + (renormalise ? " renormalised" : "");
}

// N = 1, 2, 63, 197 and a distilled-DeiT-like prefix of 2 on a non-square grid.
const TokenGrid kGrids[] = {{0, 1, 1}, {1, 1, 1}, {0, 7, 9}, {1, 14, 14}, {2, 5, 9}};

TEST(Distance, FastMatchesReferenceOnEveryFamily) {
  for (const std::string& spec : test::all_variant_specs()) {
    for (const TokenGrid& g : kGrids) {
      for (int d : {1, 60}) {
        const Variant v = parse_variant(spec, Convention::Paper, 4);
        const double mean = test::input_mean(v);
        const MatF q = test::random_matrix(g.tokens(), d, 17, mean).cast<float>();
        const MatF k = test::random_matrix(g.tokens(), d, 18, mean).cast<float>();
        const double scale = 1.0 / std::sqrt(static_cast<double>(d));
        const PatchGeometry geo(g, 16.0, 12.0);
        const MatD w = attention_weights<double>(v, q.cast<double>(), k.cast<double>(), scale);
        const double bound =
            std::max(1.0, w.cwiseAbs().maxCoeff() * g.tokens() * geo.max_distance());
        // Softmax heads within the float range are measured in float: the bound of
        // float_softmax_rows.hpp, relative (2 r / (1 - r)), plus the double path's tolerance.
        const test::FloatRowsBound fb = test::float_rows_bound(v, q, k, scale);
        const double rel = fb.used ? 2.0 * fb.r / (1.0 - fb.r) : 0.0;
        for (bool renormalise : {false, true}) {
          const DistanceOptions opt{renormalise};
          const std::string what = config(spec, g, d, renormalise) + (fb.used ? " float" : "");
          const DistanceRows fast = attention_distance(v, q, k, scale, geo, opt);
          const DistanceRows ref = attention_distance_reference(v, q, k, scale, geo, opt);
          ASSERT_EQ(fast.distance.size(), static_cast<std::size_t>(g.tokens())) << what;
          EXPECT_EQ(fast.degenerate, ref.degenerate) << what;
          EXPECT_EQ(fast.negative_rows, ref.negative_rows) << what;
          EXPECT_EQ(fast.without_grid_mass, ref.without_grid_mass) << what;
          for (std::size_t i = 0; i < fast.distance.size(); ++i) {
            ASSERT_EQ(std::isnan(fast.distance[i]), std::isnan(ref.distance[i]))
                << what << " token " << i;
            if (i < static_cast<std::size_t>(g.prefix)) {
              EXPECT_TRUE(std::isnan(fast.distance[i])) << what;
            }
            if (std::isnan(ref.distance[i])) continue;
            // Renormalised rows divide by the grid mass, which can be small for signed weights.
            const double scale_i =
                renormalise ? bound / std::max(1e-300, std::abs(ref.grid_mass[i])) : bound;
            EXPECT_NEAR(fast.distance[i], ref.distance[i],
                        kDistanceTol * std::max(1.0, scale_i) + rel * std::abs(ref.distance[i]))
                << what << " token " << i;
            EXPECT_NEAR(fast.grid_mass[i], ref.grid_mass[i],
                        kDistanceTol * std::max(1.0, w.cwiseAbs().maxCoeff() * g.tokens()) +
                            rel * std::abs(ref.grid_mass[i]))
                << what << " token " << i;
          }
        }
      }
    }
  }
}

// A third implementation: the registry-free reference weights of lib/src/reference, summed here.
TEST(Distance, AgreesWithRegistryFreeWeights) {
  const TokenGrid g{1, 5, 9};
  const PatchGeometry geo(g, 4.0, 4.0);
  for (const std::string& spec : test::all_variant_specs()) {
    const Variant v = parse_variant(spec, Convention::Paper, 4);
    const double mean = test::input_mean(v);
    const MatF q = test::random_matrix(g.tokens(), 7, 31, mean).cast<float>();
    const MatF k = test::random_matrix(g.tokens(), 7, 32, mean).cast<float>();
    std::vector<int> degenerate;
    const MatD w = reference::weights(v, to_double(q), to_double(k), 0.4, nullptr, &degenerate);
    const DistanceRows fast = attention_distance(v, q, k, 0.4, geo, {});
    const double bound = std::max(1.0, w.cwiseAbs().maxCoeff() * g.tokens() * geo.max_distance());
    const test::FloatRowsBound fb = test::float_rows_bound(v, q, k, 0.4);
    const double rel = fb.used ? 2.0 * fb.r / (1.0 - fb.r) : 0.0;
    for (int i = g.prefix; i < g.tokens(); ++i) {
      if (std::find(degenerate.begin(), degenerate.end(), i) != degenerate.end()) {
        EXPECT_TRUE(std::isnan(fast.distance[static_cast<std::size_t>(i)]))
            << spec << " token " << i;
        continue;
      }
      double want = 0.0;
      for (int j = g.prefix; j < g.tokens(); ++j) {
        const double dy = 4.0 * (g.row(i) - g.row(j)), dx = 4.0 * (g.col(i) - g.col(j));
        want += w(i, j) * std::sqrt(dy * dy + dx * dx);
      }
      EXPECT_NEAR(fast.distance[static_cast<std::size_t>(i)], want,
                  kDistanceTol * bound + rel * std::abs(want))
          << spec << " token " << i;
    }
  }
}

/// Softmax inputs whose row i is one-hot on key target[i] (exactly 1 there, exactly 0 elsewhere:
/// every other logit is 1000 below, and exp underflows to 0).
void one_hot_inputs(const std::vector<int>& target, MatF& q, MatF& k) {
  const int n = static_cast<int>(target.size());
  k = MatF::Identity(n, n);
  q = MatF::Zero(n, n);
  for (int i = 0; i < n; ++i) q(i, target[static_cast<std::size_t>(i)]) = 1000.0F;
}

TEST(Distance, OneHotRowIsTheExactGridDistance) {
  for (const TokenGrid& g : {TokenGrid{1, 5, 9}, TokenGrid{2, 4, 3}, TokenGrid{0, 3, 7}}) {
    const int n = g.tokens();
    std::vector<int> target(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i)
      target[static_cast<std::size_t>(i)] = g.prefix + (7 * i + 3) % (n - g.prefix);
    MatF q, k;
    one_hot_inputs(target, q, k);
    const PatchGeometry geo(g, 16.0, 10.0);
    for (bool renormalise : {false, true}) {
      for (const bool reference : {false, true}) {
        const DistanceRows r =
            reference ? attention_distance_reference(parse_variant("softmax"), q, k, 1.0, geo,
                                                     {renormalise})
                      : attention_distance(parse_variant("softmax"), q, k, 1.0, geo, {renormalise});
        for (int i = g.prefix; i < n; ++i) {
          const int j = target[static_cast<std::size_t>(i)];
          const double dy = 16.0 * (g.row(i) - g.row(j)), dx = 10.0 * (g.col(i) - g.col(j));
          EXPECT_EQ(r.distance[static_cast<std::size_t>(i)], std::sqrt(dy * dy + dx * dx))
              << "grid " << g.prefix << "+" << g.height << "x" << g.width << " query " << i
              << " key " << j << (reference ? " reference" : " fast");
          EXPECT_EQ(r.grid_mass[static_cast<std::size_t>(i)], 1.0);
        }
      }
    }
  }
}

// Negative control for dropping the prefix: every grid query puts all its mass on CLS (token 0).
// With CLS dropped the distance is 0 and the grid mass 0; were CLS taken as a grid cell (or the
// token index not shifted by the prefix), CLS would sit at some cell and the distance would not
// be 0 for most queries. Renormalised, such rows have no grid mass and are left out.
TEST(Distance, PrefixKeysAreDropped) {
  const TokenGrid g{1, 4, 6};
  MatF q, k;
  one_hot_inputs(std::vector<int>(static_cast<std::size_t>(g.tokens()), 0), q, k);
  const PatchGeometry geo(g, 8.0, 8.0);
  const DistanceRows plain = attention_distance(parse_variant("softmax"), q, k, 1.0, geo, {false});
  const DistanceRows renorm = attention_distance(parse_variant("softmax"), q, k, 1.0, geo, {true});
  EXPECT_TRUE(std::isnan(plain.distance[0])) << "the CLS query is not a grid query";
  for (int i = g.prefix; i < g.tokens(); ++i) {
    EXPECT_EQ(plain.distance[static_cast<std::size_t>(i)], 0.0) << "query " << i;
    EXPECT_EQ(plain.grid_mass[static_cast<std::size_t>(i)], 0.0) << "query " << i;
    EXPECT_TRUE(std::isnan(renorm.distance[static_cast<std::size_t>(i)])) << "query " << i;
  }
  EXPECT_EQ(renorm.without_grid_mass, g.height * g.width);
  // Half of each grid row's mass on CLS, half on the query's opposite corner: not renormalised the
  // CLS half counts as nothing, renormalised the distance is the corner's.
  MatF q2 = MatF::Zero(g.tokens(), g.tokens());
  const int corner = g.token(g.height - 1, g.width - 1);
  for (int i = 0; i < g.tokens(); ++i) q2(i, 0) = q2(i, corner) = 1000.0F;
  const DistanceRows half = attention_distance(parse_variant("softmax"), q2, k, 1.0, geo, {false});
  const DistanceRows half_r = attention_distance(parse_variant("softmax"), q2, k, 1.0, geo, {true});
  const int first = g.token(0, 0);
  const double corner_distance = geo.max_distance();
  EXPECT_DOUBLE_EQ(half.distance[static_cast<std::size_t>(first)], 0.5 * corner_distance);
  EXPECT_DOUBLE_EQ(half_r.distance[static_cast<std::size_t>(first)], corner_distance);
}

TEST(Distance, IdenticalKeysGiveTheUniformBaseline) {
  const TokenGrid g{1, 6, 5};
  const PatchGeometry geo(g, 2.0, 2.0);
  for (const AttentionFamily* family : test::qk_families()) {
    if (family->position_dependent()) continue;  // cosFormer's rows are not uniform on equal keys
    const Variant v = parse_variant(example_spec(*family));
    const MatF q = test::random_matrix(g.tokens(), 7, 5, 1.0).cast<float>();
    const MatF k = test::random_matrix(1, 7, 6, 1.0).cast<float>().replicate(g.tokens(), 1);
    for (bool renormalise : {false, true}) {
      const DistanceRows r = attention_distance(v, q, k, 0.4, geo, {renormalise});
      double mean = 0.0;
      for (int i = g.prefix; i < g.tokens(); ++i) mean += r.distance[static_cast<std::size_t>(i)];
      mean /= g.height * g.width;
      EXPECT_NEAR(mean, uniform_distance(geo, renormalise), 1e-6)
          << v.name() << (renormalise ? " renormalised" : "");
    }
  }
}

TEST(Distance, DegenerateRowsAreCountedAndLeftOut) {
  const TokenGrid g{1, 3, 3};
  const PatchGeometry geo(g, 1.0, 1.0);
  MatF q = test::random_matrix(g.tokens(), 4, 1).cwiseAbs().cast<float>();
  const MatF k = test::random_matrix(g.tokens(), 4, 2).cast<float>();
  q.row(3) = -q.row(3).cwiseAbs() - MatF::Ones(1, 4);  // relu(q_3) = 0
  q.row(0) = -q.row(0).cwiseAbs() - MatF::Ones(1, 4);  // the CLS row: not a grid row, not counted
  const DistanceRows r = attention_distance(parse_variant("linear:relu"), q, k, 0.5, geo, {});
  EXPECT_EQ(r.degenerate, 1);
  EXPECT_TRUE(std::isnan(r.distance[3]));
  EXPECT_FALSE(std::isnan(r.distance[4]));
}

TEST(Distance, SignedWeightsAreTakenAsGiven) {
  // InLine in the paper convention on unscaled inputs: many negative weights.
  const TokenGrid g{1, 7, 7};
  const PatchGeometry geo(g, 1.0, 1.0);
  const MatF q = test::random_matrix(g.tokens(), 16, 3).cast<float>();
  const MatF k = test::random_matrix(g.tokens(), 16, 4).cast<float>();
  const Variant v = parse_variant("inline@paper");
  const DistanceRows r = attention_distance(v, q, k, 0.25, geo, {});
  EXPECT_GT(r.negative_rows, 40);
  int outside = 0;  // signed sums: some rows leave [0, max distance]
  for (int i = g.prefix; i < g.tokens(); ++i) {
    const double x = r.distance[static_cast<std::size_t>(i)];
    if (x < 0.0 || x > geo.max_distance()) ++outside;
  }
  EXPECT_GT(outside, 0);
}

TEST(PatchGeometry, TableAndMaximum) {
  const PatchGeometry geo(TokenGrid{1, 14, 14}, 16.0, 16.0);
  EXPECT_EQ(geo.distance(0, 0), 0.0);
  EXPECT_EQ(geo.distance(3, 4), 80.0);
  EXPECT_DOUBLE_EQ(geo.max_distance(), 16.0 * 13.0 * std::sqrt(2.0));
  const PatchGeometry rect(TokenGrid{0, 2, 3}, 3.0, 4.0);
  EXPECT_EQ(rect.distance(1, 0), 3.0);
  EXPECT_EQ(rect.distance(0, 2), 8.0);
  EXPECT_EQ(PatchGeometry(TokenGrid{1, 1, 1}, 5.0, 5.0).max_distance(), 0.0);
  EXPECT_THROW(PatchGeometry(TokenGrid{1, 2, 2}, 0.0, 1.0), UsageError);
  EXPECT_THROW(PatchGeometry(TokenGrid{1, 2, 2}, std::nan(""), 1.0), UsageError);
}

TEST(PatchGeometry, CellRowsAreTheTableInGridOrder) {
  const TokenGrid g{1, 7, 9};
  const PatchGeometry geo(g, 16.0, 10.0);
  const int cells = g.height * g.width;
  for (int a = 0; a < cells; ++a) {
    const double* row = geo.cell_row(a);
    ASSERT_NE(row, nullptr);
    for (int b = 0; b < cells; ++b) {
      ASSERT_EQ(row[b], geo.distance(std::abs(a / g.width - b / g.width),
                                     std::abs(a % g.width - b % g.width)))
          << "cells " << a << ", " << b;
    }
  }
  // Above the table's size there is none: float_distance assembles the rows instead.
  EXPECT_EQ(PatchGeometry(TokenGrid{0, 25, 24}, 16.0, 16.0).cell_row(0), nullptr);
  EXPECT_NE(PatchGeometry(TokenGrid{0, 24, 24}, 16.0, 16.0).cell_row(575), nullptr);
}

TEST(Distance, WrongGridIsAUsageError) {
  const PatchGeometry geo(TokenGrid{1, 3, 3}, 1.0, 1.0);
  const MatF q = MatF::Ones(9, 2);
  EXPECT_THROW((void)attention_distance(parse_variant("softmax"), q, q, 1.0, geo, {}), UsageError);
  EXPECT_THROW((void)attention_distance_reference(parse_variant("softmax"), q, q, 1.0, geo, {}),
               UsageError);
}

TEST(HistogramBins, EdgesAndOutsideBins) {
  const HistogramBins b{0.0, 10.0, 5};
  EXPECT_EQ(b.slots(), 7u);
  EXPECT_EQ(b.index(-1e-300), 0u);
  EXPECT_EQ(b.index(0.0), 1u);
  EXPECT_EQ(b.index(1.999), 1u);
  EXPECT_EQ(b.index(2.0), 2u);
  EXPECT_EQ(b.index(10.0), 5u);  // hi falls in the last bin
  EXPECT_EQ(b.index(10.0000001), 6u);
  EXPECT_EQ(b.edge(0), 0.0);
  EXPECT_EQ(b.edge(5), 10.0);
  const HistogramBins point{0.0, 0.0, 3};
  EXPECT_EQ(point.index(0.0), 1u);
  EXPECT_EQ(point.index(1.0), 4u);
}

// "Averaged over queries, then images": an image with more valid queries weighs no more.
TEST(QueryStats, MeansOverQueriesThenImages) {
  Selection sel;
  sel.layers = {0};
  sel.heads = {0};
  QueryStatsLayout layout;
  layout.quantities = {"x"};
  layout.counters = {"c"};
  layout.bins = HistogramBins{0.0, 10.0, 10};
  QueryStatsTotals totals({parse_variant("softmax")}, sel, layout);
  const double nan = std::nan("");
  const std::vector<std::vector<double>> images = {{1.0, 1.0, 1.0, 1.0}, {9.0, nan, nan, nan}};
  for (std::size_t m = 0; m < images.size(); ++m) {
    QueryStatsImage img;
    img.image = static_cast<int>(m);
    img.cells = labelled_cells(1, sel, layout);
    fold_head(layout, HeadQueryValues{{images[m]}, {3}}, img.cells[0][0]);
    totals.add(img);
  }
  const QueryStatsCell& c = totals.result().cells[0][0];
  EXPECT_EQ(c.images[0].mean, 5.0);          // (1 + 9) / 2
  EXPECT_EQ(c.queries[0].mean, 13.0 / 5.0);  // pooled
  EXPECT_EQ(c.queries[0].count, 5);
  EXPECT_EQ(c.counters[0], 6);
  EXPECT_EQ(c.histogram[2], 4);   // [1, 2)
  EXPECT_EQ(c.histogram[10], 1);  // [9, 10]
  EXPECT_EQ(totals.measured(), 5);
  QueryStatsCell cell = labelled_cells(1, sel, layout)[0][0];
  EXPECT_THROW(fold_head(layout, HeadQueryValues{{}, {}}, cell), UsageError);
}

// fold_head takes several quantities side by side; each one's statistics are those of its values
// added one after the other in their order (the same bits), NaN left out, the histogram from the
// first quantity alone, whatever the lengths.
TEST(QueryStatsFold, EachQuantityIsItsOwnValuesInOrder) {
  QueryStatsLayout layout;
  layout.quantities = {"a", "b", "c"};
  layout.counters = {"n"};
  layout.bins = HistogramBins{0.0, 1.0, 4};
  Selection sel;
  sel.layers = {0};
  sel.heads = {0};
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::mt19937_64 gen(3);
  std::uniform_real_distribution<double> u(-0.5, 1.5);
  std::vector<std::vector<double>> values = {{}, {}, {}};
  for (std::size_t q = 0; q < 3; ++q) {
    const std::size_t n = 50 + 17 * q;  // lengths 50, 67, 84
    for (std::size_t t = 0; t < n; ++t) values[q].push_back(t % (7 + q) == 3 ? nan : u(gen) * 1e3 + 1e7 * (t % 5 == 0));
  }
  QueryStatsCell cell = labelled_cells(1, sel, layout)[0][0];
  fold_head(layout, HeadQueryValues{values, {4}}, cell);
  for (std::size_t q = 0; q < 3; ++q) {
    RunningStats want;
    for (double x : values[q])
      if (!std::isnan(x)) want.add(x);
    EXPECT_EQ(cell.queries[q].count, want.count) << q;
    EXPECT_EQ(cell.queries[q].mean, want.mean) << q;
    EXPECT_EQ(cell.queries[q].m2, want.m2) << q;
    EXPECT_EQ(cell.queries[q].min, want.min) << q;
    EXPECT_EQ(cell.queries[q].max, want.max) << q;
  }
  std::vector<std::int64_t> histogram(layout.bins.slots(), 0);
  for (double x : values[0])
    if (!std::isnan(x)) ++histogram[layout.bins.index(x)];
  EXPECT_EQ(cell.histogram, histogram);
  EXPECT_EQ(cell.counters[0], 4);
}

}  // namespace
}  // namespace attnscope::analyses
