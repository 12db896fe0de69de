// Masks: the grid mask helpers, and masked weights and outputs of every family against the
// reference (renormalised over kept keys, masked entries exactly 0, empty rows degenerate).
#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"
#include "compare.hpp"
#include "random_inputs.hpp"
#include "reference.hpp"
#include "tolerances.hpp"
#include "variant_specs.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

namespace attnscope {
namespace {

constexpr std::uint64_t kSeed = 777;

std::string grid_name(const TokenGrid& g) {
  return "grid prefix=" + std::to_string(g.prefix) + " " + std::to_string(g.height) + "x" +
         std::to_string(g.width);
}

const std::vector<TokenGrid>& grids() {
  static const std::vector<TokenGrid> g{{1, 14, 14}, {0, 3, 5}, {2, 7, 7}, {1, 1, 1}, {0, 1, 6}};
  return g;
}

TEST(LocalWindowMask, MatchesCoordinateReference) {
  for (const TokenGrid& g : grids()) {
    for (int k : {1, 3, 5, 7}) {
      const Mask got = local_window_mask(g, k);
      const Mask want = reference::local_window_mask(g, k);
      EXPECT_TRUE((got == want).all()) << grid_name(g) << " k=" << k;
      for (int t = 0; t < g.prefix; ++t) EXPECT_TRUE(got.row(t).all()) << "prefix query " << t;
      for (int t = g.prefix; t < g.tokens(); ++t) {
        EXPECT_EQ(static_cast<int>((!got.row(t)).count()), g.window_size(t, k))
            << grid_name(g) << " k=" << k << " query " << t;
      }
    }
  }
}

TEST(RandomOutsideMask, DropsExactlyNKeysOutsideTheWindow) {
  for (const TokenGrid& g : grids()) {
    for (int n : {0, 1, 9, 25, 49, 1000}) {
      const std::string where = grid_name(g) + " n=" + std::to_string(n);
      const Mask m = random_outside_mask(g, n, kSeed);
      ASSERT_EQ(m.rows(), g.tokens()) << where;
      for (int t = 0; t < g.prefix; ++t) EXPECT_TRUE(m.row(t).all()) << where << " prefix " << t;
      for (int t = g.prefix; t < g.tokens(); ++t) {
        const std::vector<int> near = reference::window(g, t, 3);
        const int outside = g.height * g.width - static_cast<int>(near.size());
        EXPECT_EQ(static_cast<int>((!m.row(t)).count()), std::min(n, outside)) << where << " q " << t;
        for (int j = 0; j < g.tokens(); ++j) {
          const bool in_window = std::find(near.begin(), near.end(), j) != near.end();
          if (!m(t, j)) {
            EXPECT_TRUE(g.on_grid(j) && !in_window) << where << " query " << t << " lost key " << j;
          }
        }
      }
    }
  }
}

TEST(RandomOutsideMask, SeededAndSpreadOverCandidates) {
  const TokenGrid g{1, 14, 14};
  EXPECT_TRUE((random_outside_mask(g, 9, 5) == random_outside_mask(g, 9, 5)).all());
  EXPECT_FALSE((random_outside_mask(g, 9, 5) == random_outside_mask(g, 9, 6)).all());
  // Over many seeds, every candidate of a corner query gets drawn (a draw restricted to part of
  // the candidates would leave some never masked).
  const int query = g.token(0, 0);
  std::set<int> seen;
  for (std::uint64_t seed = 0; seed < 400; ++seed) {
    const Mask m = random_outside_mask(g, 9, seed);
    for (int j = 0; j < g.tokens(); ++j) {
      if (!m(query, j)) seen.insert(j);
    }
  }
  EXPECT_EQ(static_cast<int>(seen.size()), 14 * 14 - 4);
}

TEST(RandomOutsideMask, NegativeCountThrows) {
  EXPECT_THROW((void)random_outside_mask(TokenGrid{0, 3, 3}, -1, 1), UsageError);
}

class MaskedVariant : public ::testing::TestWithParam<std::string> {};

struct NamedMask {
  std::string name;
  Mask mask;
  int empty_rows;  ///< rows 0 .. empty_rows-1 keep no key
};

/// Masks used on N tokens: a random one with two empty rows, and the grid masks when N fits.
std::vector<NamedMask> masks_for(int n, std::uint64_t seed) {
  const int empty = std::min(n, 2);
  std::vector<NamedMask> out{{"random keep 0.6", test::random_mask(n, n, 0.6, seed, empty), empty}};
  if (n == 197) {
    const TokenGrid g{1, 14, 14};
    out.push_back({"local 3x3", local_window_mask(g, 3), 0});
    out.push_back({"local 7x7", local_window_mask(g, 7), 0});
    out.push_back({"random outside 25", random_outside_mask(g, 25, seed), 0});
  }
  return out;
}

template <typename T>
void masked_matches_reference(const Variant& v) {
  for (int n : test::kAwkwardN) {
    for (int d : test::kAwkwardD) {
      const std::uint64_t seed = kSeed + static_cast<std::uint64_t>(n * 100 + d);
      const test::Qkv in = test::random_qkv(n, d, 3, seed, test::input_mean(v));
      const double scale = 1.0 / std::sqrt(static_cast<double>(d));
      for (const auto& [mask_name, mask, empty_rows] : masks_for(n, seed)) {
        const std::string where = test::config(v.name() + " mask " + mask_name, n, d, seed,
                                               test::precision_name<T>());
        std::vector<int> ref_deg;
        const MatD q = test::rounded<T>(in.q), k = test::rounded<T>(in.k), val = test::rounded<T>(in.v);
        const MatD want_w = reference::weights(v, q, k, scale, &mask, &ref_deg);
        const MatD want_o = reference::outputs(v, q, k, val, scale, &mask);
        Diagnostics wd, od;
        const Mat<T> w = attention_weights<T>(v, test::as<T>(in.q), test::as<T>(in.k), scale, &mask, &wd);
        const Mat<T> o = attention_outputs<T>(v, test::as<T>(in.q), test::as<T>(in.k),
                                              test::as<T>(in.v), scale, &mask, &od);
        EXPECT_TRUE(test::matrices_near(w, want_w, test::tolerance<T>(), where + " weights"));
        EXPECT_TRUE(test::matrices_near(o, want_o, test::tolerance<T>(), where + " outputs"));
        EXPECT_EQ(wd.degenerate_rows, ref_deg) << where;
        EXPECT_EQ(od.degenerate_rows, ref_deg) << where;
        EXPECT_TRUE(test::rows_sum_to_one(w, test::row_sum_tolerance<T>(), where, wd.degenerate_rows));
        EXPECT_TRUE((mask || w.array() == T(0)).all()) << where << ": a masked entry is not exactly 0";
        for (int row = 0; row < empty_rows; ++row) {
          EXPECT_TRUE(std::binary_search(wd.degenerate_rows.begin(), wd.degenerate_rows.end(), row))
              << where << ": empty row " << row << " not reported";
        }
      }
    }
  }
}

TEST_P(MaskedVariant, MatchesReferenceDouble) { masked_matches_reference<double>(parse_variant(GetParam())); }
TEST_P(MaskedVariant, MatchesReferenceFloat) { masked_matches_reference<float>(parse_variant(GetParam())); }

TEST_P(MaskedVariant, AllTrueMaskEqualsNoMask) {
  const Variant v = parse_variant(GetParam());
  const test::Qkv in = test::random_qkv(50, 7, 3, kSeed, test::input_mean(v));
  const Mask all = Mask::Constant(50, 50, true);
  const MatD masked = attention_outputs<double>(v, in.q, in.k, in.v, 0.4, &all);
  const MatD plain = attention_outputs<double>(v, in.q, in.k, in.v, 0.4);
  EXPECT_TRUE(test::matrices_near(masked, plain, test::kDoubleTol, v.name() + " all-true mask N=50 d=7"));
}

INSTANTIATE_TEST_SUITE_P(Masks, MaskedVariant, ::testing::ValuesIn(test::all_variant_specs()),
                         [](const auto& p) { return test::param_name(p.param); });

TEST(MaskedCodeConvention, FeatureFactorKeepsTheModelsN) {
  // inline@code under a mask: w_ij = c^2 q.k_j - (1/n_i) sum_kept c^2 q.k_m + 1/n_i with
  // c^2 = s/N, N the model's token count (not n_i).
  const test::Qkv in = test::random_qkv(12, 4, 2, kSeed, 0.0);
  const Mask mask = test::random_mask(12, 12, 0.5, kSeed);
  const double s = 0.5, c2 = s / 12.0;
  const MatD w = attention_weights<double>(parse_variant("inline@code"), in.q, in.k, s, &mask);
  for (int i = 0; i < 12; ++i) {
    const int n_i = static_cast<int>(mask.row(i).count());
    if (n_i == 0) continue;
    double sum_kept = 0.0;
    for (int m = 0; m < 12; ++m) {
      if (mask(i, m)) sum_kept += c2 * in.q.row(i).dot(in.k.row(m));
    }
    for (int j = 0; j < 12; ++j) {
      const double want = mask(i, j) ? c2 * in.q.row(i).dot(in.k.row(j)) - sum_kept / n_i + 1.0 / n_i : 0.0;
      EXPECT_NEAR(w(i, j), want, 1e-14) << "inline@code masked, row " << i << " col " << j;
    }
  }
}

}  // namespace
}  // namespace attnscope
