// Spikiness: row statistics, sweep parameters, the sweep's rows against the plain-loop reference,
// the papers' laws (MALA eq. 6, 7, 11, 12; InLine eq. 4), and query sampling.
#include "attnscope/analyses/spikiness.hpp"
#include "attnscope/error.hpp"
#include "attnscope/synth.hpp"
#include "compare.hpp"
#include "random_inputs.hpp"
#include "reference.hpp"
#include "reference_sweep.hpp"
#include "tolerances.hpp"
#include "variant_specs.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>

namespace attnscope::analyses {
namespace {

constexpr std::uint64_t kSeed = 4242;

VecD vec(std::initializer_list<double> xs) {
  VecD v(static_cast<Eigen::Index>(xs.size()));
  Eigen::Index i = 0;
  for (double x : xs) v[i++] = x;
  return v;
}

// ---- row statistics ------------------------------------------------------------------------

TEST(RowStats, UniformRowHasFullEntropy) {
  for (int n : {1, 2, 50, 197}) {
    const RowStats s = row_stats(VecD::Constant(n, 1.0 / n), 5);
    EXPECT_NEAR(s.entropy, std::log(n), 1e-12) << "N=" << n;
    EXPECT_NEAR(s.effective_keys, n, 1e-9) << "N=" << n;
    EXPECT_NEAR(s.max_weight, 1.0 / n, 1e-15) << "N=" << n;
    EXPECT_NEAR(s.topk_mass, std::min(5, n) / static_cast<double>(n), 1e-12) << "N=" << n;
    EXPECT_EQ(s.negatives, 0) << "N=" << n;
    EXPECT_EQ(s.zeros, 0) << "N=" << n;
  }
}

TEST(RowStats, OneHotRowHasOneEffectiveKeyAndCountsZeros) {
  const RowStats s = row_stats(vec({0.0, 1.0, 0.0, 0.0}), 2);
  EXPECT_EQ(s.entropy, 0.0);
  EXPECT_EQ(s.effective_keys, 1.0);
  EXPECT_EQ(s.max_weight, 1.0);
  EXPECT_EQ(s.topk_mass, 1.0);
  EXPECT_EQ(s.zeros, 3);
  EXPECT_EQ(s.negatives, 0);
}

TEST(RowStats, NegativeWeightsAreClippedAndCounted) {
  // Positive part {0.6, 0.6} renormalises to {1/2, 1/2}: entropy ln 2; raw top-2 mass 1.2.
  const RowStats s = row_stats(vec({0.6, -0.2, 0.6}), 2);
  EXPECT_NEAR(s.entropy, std::log(2.0), 1e-15);
  EXPECT_NEAR(s.effective_keys, 2.0, 1e-14);
  EXPECT_NEAR(s.topk_mass, 1.2, 1e-15);
  EXPECT_EQ(s.negatives, 1);
  EXPECT_EQ(s.zeros, 0);
}

TEST(RowStats, RowWithoutPositiveWeightHasNoEntropy) {
  const RowStats s = row_stats(vec({-0.5, 0.0, -1.0}), 5);
  EXPECT_TRUE(std::isnan(s.entropy));
  EXPECT_TRUE(std::isnan(s.effective_keys));
  EXPECT_NEAR(s.topk_mass, -1.5, 1e-15);  // k clipped to N
  EXPECT_EQ(s.negatives, 2);
  EXPECT_EQ(s.zeros, 1);
}

TEST(RowStats, MatchesPlainLoopOnRandomRows) {
  for (int n : {2, 50, 197}) {
    const MatD raw = test::random_matrix(1, n, kSeed + static_cast<std::uint64_t>(n));
    const VecD w = raw.row(0).transpose();
    double pos = 0, h = 0, top = -1e300;
    for (int j = 0; j < n; ++j) pos += std::max(w[j], 0.0), top = std::max(top, w[j]);
    for (int j = 0; j < n; ++j) {
      if (w[j] > 0) h -= (w[j] / pos) * std::log(w[j] / pos);
    }
    std::vector<double> sorted(w.data(), w.data() + n);
    std::sort(sorted.rbegin(), sorted.rend());
    double mass = 0;
    for (int j = 0; j < std::min(3, n); ++j) mass += sorted[static_cast<std::size_t>(j)];
    const RowStats s = row_stats(w, 3);
    EXPECT_NEAR(s.entropy, h, 1e-12) << "N=" << n;
    EXPECT_NEAR(s.topk_mass, mass, 1e-12) << "N=" << n;
    EXPECT_EQ(s.max_weight, top) << "N=" << n;
    EXPECT_EQ(s.negatives, (w.array() < 0).count()) << "N=" << n;
  }
}

// ---- parameters -----------------------------------------------------------------------------

TEST(ParseScales, LogSpacedRangeKeepsBothEnds) {
  const auto s = parse_scales("0.25:8:33");
  ASSERT_EQ(s.size(), 33u);
  EXPECT_EQ(s.front(), 0.25);
  EXPECT_EQ(s.back(), 8.0);
  const double step = std::pow(32.0, 1.0 / 32.0);
  for (std::size_t i = 1; i < s.size(); ++i) EXPECT_NEAR(s[i] / s[i - 1], step, 1e-12) << i;
}

TEST(ParseScales, ListsAndErrors) {
  EXPECT_EQ(parse_scales("0.5,1,2"), (std::vector<double>{0.5, 1.0, 2.0}));
  EXPECT_EQ(parse_scales("3"), (std::vector<double>{3.0}));
  for (const char* bad : {"", "0:1:3", "1:2", "1:2:0", "a,b", "-1", "1,,2", "inf", "1:2:x"}) {
    EXPECT_THROW((void)parse_scales(bad), UsageError) << "'" << bad << "'";
  }
}

// A factor listed twice would repeat every row of its scale.
TEST(ParseScales, RepeatedFactorsAreErrors) {
  for (const char* bad : {"1,1", "0.5,2,0.50", "1,2,1"}) {
    EXPECT_THROW((void)parse_scales(bad), UsageError) << "'" << bad << "'";
  }
}

TEST(KeyRef, TopMedianBottomAndIndices) {
  const VecD w = vec({0.1, 0.4, 0.1, 0.3, 0.1});  // ties at 0.1 broken by index
  const KeyPair def = parse_key_pair("top,median");
  EXPECT_EQ(def.high.resolve(w), 1);
  EXPECT_EQ(def.low.resolve(w), 0);  // sorted: 1, 3, 0, 2, 4 -> rank 2 is key 0
  EXPECT_EQ(parse_key_pair("bottom,3").high.resolve(w), 4);
  EXPECT_EQ(parse_key_pair("bottom,3").low.resolve(w), 3);
  EXPECT_THROW((void)parse_key_pair("2,9").low.resolve(w), UsageError);
  for (const char* bad : {"top", "top,median,bottom", "first,top", "-1,top", "", "top,top", "3,3"}) {
    EXPECT_THROW((void)parse_key_pair(bad), UsageError) << "'" << bad << "'";
  }
}

// ---- sweeps against the reference ----------------------------------------------------------

SpikinessOptions sweep_options() {
  SpikinessOptions o;
  o.scales = parse_scales("0.25:8:9");
  return o;
}

/// A few maps and conventions of the papers' families, and every family of the registry with
/// its default map (relu where it needs one).
std::vector<std::string> sweep_variants() {
  std::vector<std::string> out{"linear:elu1",     "inline@code",    "mala:elu1@code",
                               "linear:identity", "mala:relu@code", "linear:focused=3"};
  for (const AttentionFamily* family : test::qk_families()) {
    out.push_back(example_spec(*family));
  }
  return out;
}

TEST(HeadSweeper, RowsMatchReferenceAndLawsHold) {
  for (const std::string& spec : sweep_variants()) {
    const Variant v = parse_variant(spec);
    long points = 0;  // per variant: with ReLU and d = 1 a median key often has weight 0
    for (int n : {2, 50, 197}) {
      for (int d : {1, 7, 64}) {
        const std::uint64_t seed = kSeed + static_cast<std::uint64_t>(n * 100 + d);
        const auto in = test::random_qkv(n, d, d, seed, test::input_mean(v));
        const double scale = 1.0 / std::sqrt(static_cast<double>(d));
        const std::string where = test::config(v.name(), n, d, seed, "double");
        const SpikinessOptions opts = sweep_options();
        const HeadSweeper sweeper(v, in.k, scale, opts);
        auto laws = sweeper.laws();
        for (int i = 0; i < std::min(n, 5); ++i) {
          const VecD q = in.q.row(i).transpose();
          const QuerySweep s = sweeper.sweep(q, i, true, &laws);
          ASSERT_EQ(s.points.size(), opts.scales.size()) << where;
          const VecD w1 = test::reference_sweep_row(v, sweeper.space(), q, i, 1.0, in.k, scale);
          EXPECT_EQ(s.key_high, KeyRef{}.resolve(w1)) << where << " query " << i;
          for (std::size_t j = 0; j < opts.scales.size(); ++j) {
            const VecD want =
                test::reference_sweep_row(v, sweeper.space(), q, i, opts.scales[j], in.k, scale);
            EXPECT_TRUE(test::matrices_near(
                MatD(s.weights[j]), MatD(want), test::kDoubleTol,
                where + " query " + std::to_string(i) + " a=" + std::to_string(opts.scales[j])));
          }
        }
        for (const LawResult& law : laws) {
          EXPECT_TRUE(law.applicable) << where << " " << to_string(law.law) << ": " << law.why;
          // A law compared on no point (e.g. d = 1 with ReLU killing every query) showed
          // nothing and must not pass.
          EXPECT_EQ(law.pass(), law.has_data())
              << where << " " << to_string(law.law) << " max deviation " << law.max_deviation
              << " points " << law.points;
          points += law.points;
        }
      }
    }
    EXPECT_GT(points, 0) << v.name() << ": no law was checked";
  }
}

TEST(HeadSweeper, SoftmaxRatioIsPowerOfItsValueAtOne) {
  // Independent of the law checker: ratio(a) = exp(a s q.(k_hi - k_lo)).
  const auto in = test::random_qkv(50, 7, 7, kSeed);
  const double scale = 1.0 / std::sqrt(7.0);
  const HeadSweeper sweeper(parse_variant("softmax"), in.k, scale, sweep_options());
  const VecD q = in.q.row(3).transpose();
  const QuerySweep s = sweeper.sweep(q, 3, false, nullptr);
  const double logit_gap = scale * q.dot(in.k.row(s.key_high) - in.k.row(s.key_low));
  EXPECT_GT(logit_gap, 0.0);
  for (const SweepPoint& p : s.points) {
    EXPECT_NEAR(std::log(p.ratio), p.scale * logit_gap, 1e-12 * std::max(1.0, p.scale * logit_gap))
        << "a=" << p.scale;
  }
  // More magnitude, spikier row (MALA §3.2).
  for (std::size_t j = 1; j < s.points.size(); ++j) {
    EXPECT_LT(s.points[j].stats.entropy, s.points[j - 1].stats.entropy)
        << "a=" << s.points[j].scale;
  }
}

TEST(HeadSweeper, LinearRowDoesNotMoveWithMagnitude) {
  const auto in = test::random_qkv(50, 7, 7, kSeed + 1);
  const HeadSweeper sweeper(parse_variant("linear:elu1"), in.k, 0.4, sweep_options());
  const QuerySweep s = sweeper.sweep(in.q.row(0).transpose(), 0, true, nullptr);
  for (std::size_t j = 1; j < s.weights.size(); ++j) {
    EXPECT_TRUE(test::matrices_near(MatD(s.weights[j]), MatD(s.weights[0]), test::kDoubleTol,
                                    "linear:elu1 a=" + std::to_string(s.points[j].scale)));
  }
}

TEST(HeadSweeper, MalaRatioGrowsFractionallyTowardsAFiniteLimit) {
  // MALA eq. 12 with x = a beta / (beta + a - 1) < beta: for a key n above the mean score
  // (s_n > gamma, s_j = c^2 phi(q).phi(k_j)) both weights stay positive for every a, the ratio
  // grows with a (eq. 22) and tends to (s_m - gamma) / (s_n - gamma): a rational law, not p^a.
  // Keys below the mean turn negative once a is large enough: eq. 22's premise fails for them.
  const int n = 50, d = 7;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const MatD k = test::random_matrix(n, d, kSeed + 2, 0.0, 0.5);
  const VecD q = test::random_matrix(1, d, kSeed + 3, 0.0, 0.5).row(0).transpose();
  const Variant v = parse_variant("mala:elu1@code");
  // Scores from plain loops over the reference features.
  const MatD phi_k = reference::feature_map(v.map, k);
  const MatD phi_q = reference::feature_map(v.map, MatD(q.transpose()));
  const double c2 = scale / n;
  std::vector<double> score(static_cast<std::size_t>(n), 0.0);
  double total = 0;
  for (int j = 0; j < n; ++j) {
    for (int t = 0; t < d; ++t)
      score[static_cast<std::size_t>(j)] += c2 * phi_q(0, t) * phi_k(j, t);
    total += score[static_cast<std::size_t>(j)];
  }
  const double gamma = total / n;
  const auto top = static_cast<int>(std::max_element(score.begin(), score.end()) - score.begin());
  int low = -1;  // the weakest key above the mean
  for (int j = 0; j < n; ++j) {
    const double sj = score[static_cast<std::size_t>(j)];
    if (j != top && sj > gamma && (low < 0 || sj < score[static_cast<std::size_t>(low)])) low = j;
  }
  ASSERT_GE(low, 0);
  SpikinessOptions o;
  o.scales = parse_scales("1:64:13");
  o.keys = KeyPair{KeyRef{KeyRef::Kind::Top, 0}, KeyRef{KeyRef::Kind::Index, low}};
  const HeadSweeper sweeper(v, k, scale, o);
  auto laws = sweeper.laws();
  const QuerySweep s = sweeper.sweep(q, 0, true, &laws);
  ASSERT_EQ(s.key_high, top);
  const double limit = (score[static_cast<std::size_t>(top)] - gamma) /
                       (score[static_cast<std::size_t>(low)] - gamma);
  EXPECT_GT(s.points.front().ratio, 1.0);
  for (std::size_t j = 1; j < s.points.size(); ++j) {
    EXPECT_GT(s.points[j].ratio, s.points[j - 1].ratio) << "a=" << s.points[j].scale;
    EXPECT_LT(s.points[j].ratio, limit) << "a=" << s.points[j].scale;
  }
  // Eq. 12 from the plain-loop scores: beta = 1 + 1/S, gamma = S/N.
  const double beta = 1.0 + 1.0 / total;
  for (const SweepPoint& p : s.points) {
    const double x = p.scale * beta / (beta + p.scale - 1.0);
    const double pm = (beta * score[static_cast<std::size_t>(top)] - x * gamma) /
                      (beta * score[static_cast<std::size_t>(low)] - x * gamma);
    EXPECT_NEAR(p.ratio, pm, 1e-10 * pm) << "a=" << p.scale;
  }
  EXPECT_GT(s.points.back().stats.negatives, 0) << "keys below the mean end up negative";
  for (const LawResult& law : laws) EXPECT_TRUE(law.pass()) << to_string(law.law);
}

TEST(HeadSweeper, QuerySpaceLawsApplyOnlyToHomogeneousMaps) {
  const auto in = test::random_qkv(50, 7, 7, kSeed + 4);
  SpikinessOptions o = sweep_options();
  o.space = ScaleSpace::Query;
  const HeadSweeper elu(parse_variant("mala:elu1"), in.k, 0.4, o);
  for (const LawResult& law : elu.laws()) {
    EXPECT_FALSE(law.applicable) << to_string(law.law);
    EXPECT_FALSE(law.why.empty());
  }
  const HeadSweeper relu(parse_variant("mala:relu"), in.k, 0.4, o);
  auto laws = relu.laws();
  for (int i = 0; i < 5; ++i) (void)relu.sweep(in.q.row(i).transpose(), i, false, &laws);
  for (const LawResult& law : laws) {
    EXPECT_TRUE(law.applicable) << to_string(law.law);
    EXPECT_TRUE(law.pass()) << to_string(law.law) << " " << law.max_deviation;
  }
}

TEST(LawResult, NaNDeviationFailsAndMergeKeepsTheWorst) {
  LawResult a, b;
  a.threshold = b.threshold = 1e-8;
  a.max_deviation = 1e-12;
  b.max_deviation = 1e-3;
  a.points = 2;
  b.points = 3;
  EXPECT_TRUE(a.pass());
  a.merge(b);
  EXPECT_FALSE(a.pass());
  EXPECT_EQ(a.points, 5);
  LawResult off;
  off.applicable = false;
  off.max_deviation = 1.0;
  EXPECT_TRUE(off.pass());
}

// ---- sampling and collection ---------------------------------------------------------------

Selection small_selection() {
  Selection s;
  s.images = {0, 2};
  s.layers = {1, 3};
  s.heads = {0, 1, 2};
  return s;
}

TEST(Samples, DrawnSamplesAreDistinctSortedInRangeAndSeeded) {
  const Selection sel = small_selection();
  const auto a = draw_samples(sel, 50, 40, 7);
  const auto b = draw_samples(sel, 50, 40, 7);
  const auto c = draw_samples(sel, 50, 40, 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  ASSERT_EQ(a.size(), 40u);
  std::set<std::tuple<int, int, int, int>> seen;
  for (const auto& s : a) {
    EXPECT_TRUE(s.image == 0 || s.image == 2);
    EXPECT_TRUE(s.layer == 1 || s.layer == 3);
    EXPECT_TRUE(s.head >= 0 && s.head <= 2);
    EXPECT_TRUE(s.token >= 0 && s.token < 50);
    seen.insert({s.image, s.layer, s.head, s.token});
  }
  EXPECT_EQ(seen.size(), a.size());
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end(), [](const auto& x, const auto& y) {
    return std::tie(x.image, x.layer, x.head, x.token) <
           std::tie(y.image, y.layer, y.head, y.token);
  }));
  EXPECT_EQ(draw_samples(sel, 50, 100000, 1).size(), 2u * 2u * 3u * 50u);
}

TEST(Samples, GridSamplesCrossTheSelectionWithTokens) {
  const auto g = grid_samples(small_selection(), 50, {5, 0, 5});
  EXPECT_EQ(g.size(), 2u * 2u * 3u * 2u);
  EXPECT_THROW((void)grid_samples(small_selection(), 50, {50}), UsageError);
  EXPECT_THROW((void)grid_samples(small_selection(), 50, {-1}), UsageError);
}

TEST(SpikinessCollector, SweepsEverySampleOfSynthHeadsLikeHeadSweeper) {
  SynthOptions so;
  so.images = 2;
  so.seed = kSeed;
  Selection sel;
  sel.images = {0, 1};
  sel.layers = {0, 1, 2, 3};
  sel.heads = {0, 1, 2};
  const auto samples = draw_samples(sel, so.tokens(), 12, 3);
  const std::vector<Variant> variants = parse_variants("softmax,mala");
  SpikinessCollector collector(variants, samples, so.scale(), sweep_options(), 2);
  std::vector<ImageQKV> images;
  for (int image : sel.images) {
    images.push_back(synth_image(so, image));
    const ImageQKV& img = images.back();
    for (int l = 0; l < so.layers; ++l) {
      for (int h = 0; h < so.heads; ++h) {
        collector.add_head(HeadView{image, l, h, img.Q(l, h), img.K(l, h), img.V(l, h)});
      }
    }
  }
  const SpikinessResult r = collector.finish();
  ASSERT_EQ(r.sweeps.size(), 2u);
  for (std::size_t v = 0; v < variants.size(); ++v) {
    for (std::size_t i = 0; i < samples.size(); ++i) {
      const QuerySample& s = r.samples[i];
      const ImageQKV& img = images[static_cast<std::size_t>(s.image)];
      const HeadSweeper direct(variants[v], img.K(s.layer, s.head).cast<double>(), so.scale(),
                               sweep_options());
      const QuerySweep want = direct.sweep(
          img.Q(s.layer, s.head).row(s.token).cast<double>().transpose(), s.token, false, nullptr);
      const QuerySweep& got = r.sweeps[v][i];
      EXPECT_EQ(got.key_high, want.key_high) << variants[v].name() << " sample " << i;
      EXPECT_EQ(got.key_low, want.key_low) << variants[v].name() << " sample " << i;
      ASSERT_EQ(got.points.size(), want.points.size());
      for (std::size_t j = 0; j < got.points.size(); ++j) {
        EXPECT_EQ(got.points[j].ratio, want.points[j].ratio) << variants[v].name() << " " << i;
      }
      EXPECT_EQ(got.weights.size(), i < 2 ? got.points.size() : 0u) << "keep_weights";
    }
  }
  for (const LawResult& law : r.laws) EXPECT_TRUE(law.pass()) << law.variant << to_string(law.law);
}

TEST(SpikinessCollector, MissingHeadIsAnError) {
  Selection sel = small_selection();
  SpikinessCollector collector(parse_variants("softmax"), draw_samples(sel, 50, 3, 1), 0.25,
                               sweep_options(), 0);
  EXPECT_THROW((void)collector.finish(), Error);
}

// MALA's beta and gamma come from the family's row form: beta = 1 + 1/S, gamma = S/N with S the
// sum of the scores, in both conventions; S = 0 gives no finite beta.
TEST(MalaTerms, BetaAndGammaAreTheFamilysRowFormAtS) {
  for (const char* spec : {"mala", "mala@code", "mala:relu"}) {
    const Variant v = parse_variant(spec);
    for (int n : {1, 7, 50}) {
      const MatD phi_k = test::random_matrix(n, 6, 11).cwiseAbs();
      const VecD phi_q = test::random_matrix(6, 1, 12).cwiseAbs();
      const MalaTerms t = mala_terms(v, phi_q, phi_k);
      const VecD scores = phi_k * phi_q;
      const double s = scores.sum();
      EXPECT_EQ(t.scores, scores) << spec << " N=" << n;
      EXPECT_EQ(t.beta, 1.0 + 1.0 / s) << spec << " N=" << n;
      EXPECT_EQ(t.gamma, s / n) << spec << " N=" << n;
      // Negative control: the terms of another query differ.
      const MalaTerms other = mala_terms(v, VecD(2.0 * phi_q), phi_k);
      EXPECT_NE(other.beta, t.beta) << spec << " N=" << n;
      EXPECT_NE(other.gamma, t.gamma) << spec << " N=" << n;
    }
  }
  const MalaTerms zero = mala_terms(parse_variant("mala:relu"), VecD::Zero(4), MatD::Ones(3, 4));
  EXPECT_TRUE(std::isinf(zero.beta));
  EXPECT_EQ(zero.gamma, 0.0);
  EXPECT_THROW((void)mala_terms(parse_variant("softmax"), VecD::Ones(4), MatD::Ones(3, 4)),
               std::logic_error);
}

}  // namespace
}  // namespace attnscope::analyses
