// attnscope mask's analysis (masking.hpp): every family of the registry against a brute force from
// the plain-loop references on awkward grids, the empty-row report, the shared random draw and the
// parsing of --mask.
#include "attnscope/analyses/masking.hpp"
#include "attnscope/error.hpp"
#include "random_inputs.hpp"
#include "reference.hpp"
#include "variant_specs.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace attnscope::analyses {
namespace {

constexpr std::uint64_t kSeed = 4242;

struct Plain {
  double change = 0.0;
  bool measured = false;
  std::vector<double> removed;
  long long empty = 0, degenerate = 0;
};

/// The brute force: reference weights and outputs with and without the reference mask.
Plain plain_mask(const Variant& v, const MatD& q, const MatD& k, const MatD& values, double scale,
                 const Mask& mask) {
  std::vector<int> dead, dead_masked;
  const MatD w = reference::weights(v, q, k, scale, nullptr, &dead);
  const MatD o = reference::outputs(v, q, k, values, scale, nullptr, &dead);
  const MatD om = reference::outputs(v, q, k, values, scale, &mask, &dead_masked);
  Plain p;
  double diff2 = 0.0, base2 = 0.0;
  for (Eigen::Index i = 0; i < q.rows(); ++i) {
    const bool was_dead = std::find(dead.begin(), dead.end(), i) != dead.end();
    const bool now_dead = std::find(dead_masked.begin(), dead_masked.end(), i) != dead_masked.end();
    if (was_dead) {
      ++p.degenerate;
      continue;
    }
    if (now_dead) {
      ++p.empty;
      continue;
    }
    bool removed_any = false;
    double removed = 0.0;
    for (Eigen::Index j = 0; j < k.rows(); ++j) {
      if (!mask(i, j)) removed_any = true, removed += w(i, j);
    }
    if (removed_any) p.removed.push_back(removed);
    for (Eigen::Index c = 0; c < values.cols(); ++c) {
      diff2 += (om(i, c) - o(i, c)) * (om(i, c) - o(i, c));
      base2 += o(i, c) * o(i, c);
    }
  }
  p.measured = base2 > 0.0;
  if (p.measured) p.change = std::sqrt(diff2 / base2);
  return p;
}

class MaskEveryVariant : public ::testing::TestWithParam<std::string> {};

TEST_P(MaskEveryVariant, MatchesBruteForceOnAwkwardGrids) {
  const Variant v = parse_variant(GetParam());
  const std::vector<TokenGrid> grids{{1, 1, 1}, {0, 3, 4}, {1, 5, 5}, {2, 4, 7}};
  int measured = 0;
  for (const TokenGrid& g : grids) {
    for (const char* spec : {"local:1", "local:3", "local:5", "random:2", "random:9"}) {
      const MaskSpec m = parse_mask_specs(spec).front();
      for (int d : {1, 7}) {
        const std::uint64_t seed = kSeed + static_cast<std::uint64_t>(g.tokens() * 10 + d);
        const auto in = test::random_qkv(g.tokens(), d, 3, seed, test::input_mean(v));
        const double scale = 1.0 / std::sqrt(static_cast<double>(d));
        const Mask mask = m.kind == MaskSpec::Kind::Local ? reference::local_window_mask(g, m.size)
                                                          : build_mask(m, g, mask_seed(seed, 0, 0, 0));
        const std::string where = v.name() + " " + spec + " grid " + std::to_string(g.prefix) + "+" +
                                  std::to_string(g.height) + "x" + std::to_string(g.width) + " d=" +
                                  std::to_string(d);
        const MaskCell got = mask_head(v, in.q, in.k, in.v, scale, build_mask(m, g, mask_seed(seed, 0, 0, 0)));
        const Plain want = plain_mask(v, in.q, in.k, in.v, scale, mask);
        EXPECT_EQ(got.degenerate_rows, want.degenerate) << where;
        EXPECT_EQ(got.empty_rows, want.empty) << where;
        ASSERT_EQ(got.change.count, want.measured ? 1 : 0) << where;
        EXPECT_EQ(got.unmeasured_heads, want.measured ? 0 : 1) << where;
        if (want.measured) {
          EXPECT_NEAR(got.change.mean, want.change, 1e-9 * std::max(1.0, want.change)) << where;
          ++measured;
        }
        ASSERT_EQ(got.removed_mass.count, static_cast<std::int64_t>(want.removed.size())) << where;
        double mean = 0.0;
        for (double r : want.removed) mean += r / static_cast<double>(want.removed.size());
        if (!want.removed.empty()) {
          EXPECT_NEAR(got.removed_mass.mean, mean, 1e-9 * std::max(1.0, std::abs(mean))) << where;
        }
      }
    }
  }
  EXPECT_GT(measured, 0) << v.name() << ": nothing compared";
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, MaskEveryVariant, ::testing::ValuesIn(test::all_variant_specs()),
                         [](const ::testing::TestParamInfo<std::string>& p) { return test::param_name(p.param); });

// A window that covers the whole grid and no prefix token leaves every query without keys: the
// rows are reported as empty, the head as unmeasured, and nothing is divided by zero.
TEST(MaskHead, WindowCoveringEverythingIsReportedNotDividedByZero) {
  const TokenGrid g{0, 3, 3};
  const auto in = test::random_qkv(g.tokens(), 4, 4, kSeed);
  const MaskCell c = mask_head(parse_variant("softmax"), in.q, in.k, in.v, 0.5, build_mask(parse_mask_specs("local:5").front(), g, 0));
  EXPECT_EQ(c.empty_rows, 9);
  EXPECT_EQ(c.change.count, 0);
  EXPECT_EQ(c.unmeasured_heads, 1);
  EXPECT_TRUE(std::isfinite(c.change.mean));
  // With a prefix token the same window leaves the prefix key: nothing is empty, all is measured.
  const TokenGrid gp{1, 3, 3};
  const auto inp = test::random_qkv(gp.tokens(), 4, 4, kSeed);
  const MaskCell cp = mask_head(parse_variant("softmax"), inp.q, inp.k, inp.v, 0.5, build_mask(parse_mask_specs("local:5").front(), gp, 0));
  EXPECT_EQ(cp.empty_rows, 0);
  EXPECT_EQ(cp.change.count, 1);
  EXPECT_GT(cp.change.mean, 0.0);
}

// The random draw depends on the head and the seed, never on the family: one mask per head.
TEST(MaskSeed, SameDrawForEveryFamilyDifferentPerHead) {
  const TokenGrid g{1, 6, 6};
  const MaskSpec m = parse_mask_specs("random:9").front();
  EXPECT_TRUE((build_mask(m, g, mask_seed(1, 2, 3, 0)) == build_mask(m, g, mask_seed(1, 2, 3, 0))).all());
  EXPECT_FALSE((build_mask(m, g, mask_seed(1, 2, 3, 0)) == build_mask(m, g, mask_seed(1, 2, 3, 1))).all());
  EXPECT_FALSE((build_mask(m, g, mask_seed(1, 2, 3, 0)) == build_mask(m, g, mask_seed(1, 3, 2, 0))).all());
  EXPECT_FALSE((build_mask(m, g, mask_seed(1, 2, 3, 0)) == build_mask(m, g, mask_seed(2, 2, 3, 0))).all());
}

TEST(MaskSpecs, ParseAndRefuse) {
  const auto ms = parse_mask_specs(kDefaultMasks);
  ASSERT_EQ(ms.size(), 6U);
  EXPECT_EQ(ms[0].name(), "local:3");
  EXPECT_EQ(ms[5].name(), "random:49");
  for (const char* bad : {"", "local", "local:4", "local:0", "local:-3", "random:-1", "random:x",
                          "window:3", "local:3,local:3", "local:3,", "local:3 "}) {
    EXPECT_THROW((void)parse_mask_specs(bad), UsageError) << "'" << bad << "'";
  }
}

}  // namespace
}  // namespace attnscope::analyses
