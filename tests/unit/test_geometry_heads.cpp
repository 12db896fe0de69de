// Heads of any layer geometry (geometry_heads.hpp): on a square layer (one unit, keys = queries)
// the unit-by-unit confusion, local mass and maps agree with the square analyses and their
// references; windows with a mask are each window's masked attention; reduced keys map a query's
// cell onto the key grid.
#include "attnscope/analyses/geometry_heads.hpp"
#include "attnscope/analyses/locality.hpp"
#include "attnscope/attention.hpp"
#include "random_inputs.hpp"
#include "tolerances.hpp"
#include "variant_specs.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace attnscope::analyses {
namespace {

LayerGeometry square(const TokenGrid& g, int d) {
  LayerGeometry geo;
  geo.num_heads = 1;
  geo.head_dim = d;
  geo.scale = 1.0 / std::sqrt(static_cast<double>(d));
  geo.grid = geo.key_grid = g;
  return geo;
}

std::string config(const std::string& spec, const TokenGrid& g, int d) {
  return spec + " grid=" + std::to_string(g.prefix) + "+" + std::to_string(g.height) + "x" +
         std::to_string(g.width) + " d=" + std::to_string(d) + " seed=31";
}

TEST(GeometryHeads, SquareLayerMatchesTheSquareAnalyses) {
  const TokenGrid grids[] = {{0, 1, 1}, {1, 7, 7}, {0, 9, 9}, {2, 5, 9}};
  for (const std::string& spec : test::all_variant_specs()) {
    for (const TokenGrid& g : grids) {
      for (int d : {1, 7}) {
        const Variant v = parse_variant(spec, Convention::Paper, 4);
        const double mean = test::input_mean(v);
        const MatF q = test::random_matrix(g.tokens(), d, 31, mean).cast<float>();
        const MatF k = test::random_matrix(g.tokens(), d, 32, mean).cast<float>();
        const LayerGeometry geo = square(g, d);
        const std::string what = config(spec, g, d);
        ConfusionOptions opt;
        opt.eps = 0.05;
        const HeadConfusion ref = count_confusion_reference(v, q, q, k, geo.scale, opt);
        const HeadConfusion units = count_confusion_units(v, q, q, k, geo.scale, geo, opt);
        EXPECT_EQ(units.pairs, ref.pairs) << what;
        EXPECT_EQ(units.degenerate_rows, ref.degenerate_rows) << what;
        EXPECT_EQ(units.degenerate_pairs, ref.degenerate_pairs) << what;
        int dead_ref = -1, dead_units = -2;
        const auto want = local_mass_reference(v, q, k, geo.scale, g, 3, &dead_ref);
        const auto got = local_mass_units(v, q, k, geo.scale, geo, 3, &dead_units);
        ASSERT_EQ(got.size(), want.size()) << what;
        EXPECT_EQ(dead_units, dead_ref) << what;
        for (std::size_t i = 0; i < got.size(); ++i) {
          ASSERT_EQ(std::isnan(got[i]), std::isnan(want[i])) << what << " token " << i;
          if (!std::isnan(got[i])) {
            EXPECT_NEAR(got[i], want[i], test::kDoubleTol) << what << " token " << i;
          }
        }
        EXPECT_NEAR(uniform_baseline_units(geo, 3), uniform_baseline(g, 3), 1e-12) << what;
      }
    }
  }
}

TEST(GeometryHeads, MaskedWindowsAreEachWindowsOwnMaskedAttention) {
  // Two 3x3 windows side by side on a 3x6 grid; window 1 allows only pairs of its own columns'
  // halves (a stand-in for the shifted windows' regions).
  LayerGeometry geo;
  geo.num_heads = 1;
  geo.head_dim = 5;
  geo.scale = 0.4;
  geo.grid = geo.key_grid = TokenGrid{0, 3, 6};
  geo.windows = 2;
  geo.window_height = geo.window_width = 3;
  geo.shift = 1;
  for (int w = 0; w < 2; ++w) {
    for (int t = 0; t < 9; ++t) {
      geo.positions.push_back(t / 3);
      geo.positions.push_back(3 * w + t % 3);
    }
  }
  geo.window_mask.assign(2 * 81, 1);
  for (int i = 0; i < 9; ++i) {
    for (int j = 0; j < 9; ++j) geo.window_mask[81 + i * 9 + j] = (i % 3 == 2) == (j % 3 == 2);
  }
  const MatF q = test::random_matrix(18, 5, 41).cast<float>();
  const MatF k = test::random_matrix(18, 5, 42).cast<float>();
  const Variant v = parse_variant("softmax", Convention::Paper, 0);
  for (int w = 0; w < 2; ++w) {
    const UnitRows rows = unit_rows(v, q, k, geo.scale, geo, w);
    const Mask mask = geo.unit_mask(w);
    const MatD want = attention_weights<double>(v, q.middleRows(9 * w, 9).cast<double>(),
                                                k.middleRows(9 * w, 9).cast<double>(), geo.scale,
                                                &mask);
    EXPECT_LT((rows.w - want).cwiseAbs().maxCoeff(), 1e-15) << "window " << w;
    for (int i = 0; i < 9; ++i) {
      EXPECT_NEAR(rows.w.row(i).sum(), 1.0, 1e-12) << "window " << w << " row " << i;
      for (int j = 0; j < 9; ++j) {
        if (!mask(i, j)) {
          EXPECT_EQ(rows.w(i, j), 0.0) << "window " << w << " " << i << "," << j;
        }
      }
    }
  }
  EXPECT_FALSE(geo.masked(0));
  EXPECT_TRUE(geo.masked(1));
  // A map of cell (1, 4): window 1's keys at their cells, the other window's cells 0.
  const TokenGrid root{0, 3, 6};
  const auto map = attention_map_units(v, q, k, geo.scale, geo, root, root.token(1, 4), 0);
  ASSERT_TRUE(map.has_value());
  const UnitRows rows = unit_rows(v, q, k, geo.scale, geo, 1);
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 6; ++c) {
      const double want = c < 3 ? 0.0 : rows.w(4, r * 3 + c - 3);
      EXPECT_EQ(map->grid(r, c), want) << r << "," << c;
    }
  }
}

TEST(GeometryHeads, ReducedKeysMapTheQueryCellOntoTheKeyGrid) {
  // A 9x9 grid, keys from 4x4 (sr = 2 floors): query cell (8, 8) maps to key cell (3, 3).
  LayerGeometry geo = square(TokenGrid{0, 9, 9}, 4);
  geo.key_grid = TokenGrid{0, 4, 4};
  ASSERT_TRUE(geo.reduced());
  const MatF q = test::random_matrix(81, 4, 51).cast<float>();
  const MatF k = test::random_matrix(16, 4, 52).cast<float>();
  const Variant v = parse_variant("softmax", Convention::Paper, 0);
  const std::vector<double> mass = local_mass_units(v, q, k, geo.scale, geo, 1);
  const UnitRows rows = unit_rows(v, q, k, geo.scale, geo, 0);
  EXPECT_DOUBLE_EQ(mass[80], rows.w(80, 15));  // window 1: the mapped cell alone
  EXPECT_DOUBLE_EQ(mass[0], rows.w(0, 0));
  EXPECT_DOUBLE_EQ(mass[9 * 4 + 5], rows.w(9 * 4 + 5, 4 * 1 + 2));  // (4, 5) -> (1, 2)
  EXPECT_NEAR(uniform_baseline_units(geo, 1), 1.0 / 16, 1e-15);
}

}  // namespace
}  // namespace attnscope::analyses
