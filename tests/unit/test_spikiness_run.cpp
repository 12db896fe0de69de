// Spikiness runs (spikiness_run.hpp): the synthetic and dump sources hand out the same heads, a run
// reads only the images holding a sample and gives the sweeps of feeding every head to the
// collector, and the medians over samples ignore NaN.
#include "attnscope/analyses/spikiness_run.hpp"
#include "attnscope/error.hpp"
#include "scratch_dir.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <mutex>
#include <set>
#include <tuple>

namespace attnscope::analyses {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

SynthOptions small_model() {
  SynthOptions o;
  o.layers = 2;
  o.heads = 2;
  o.grid = TokenGrid{1, 3, 4};
  o.head_dim = 5;
  o.images = 4;
  o.seed = 7;
  return o;
}

SpikinessOptions sweep_options() {
  SpikinessOptions opt;
  opt.scales = {0.5, 1.0, 3.0};
  return opt;
}

std::vector<Variant> variants() { return parse_variants("softmax,linear:relu,inline,mala"); }

// Every field of two runs, exactly (the same heads must give the same doubles).
void expect_same(const SpikinessResult& a, const SpikinessResult& b, const std::string& what) {
  ASSERT_EQ(a.samples, b.samples) << what;
  ASSERT_EQ(a.sweeps.size(), b.sweeps.size()) << what;
  for (std::size_t v = 0; v < a.sweeps.size(); ++v) {
    for (std::size_t i = 0; i < a.samples.size(); ++i) {
      const QuerySweep &x = a.sweeps[v][i], &y = b.sweeps[v][i];
      const std::string where =
          what + ", variant " + a.variants[v].name() + ", sample " + std::to_string(i);
      EXPECT_EQ(x.key_high, y.key_high) << where;
      EXPECT_EQ(x.key_low, y.key_low) << where;
      ASSERT_EQ(x.points.size(), y.points.size()) << where;
      for (std::size_t s = 0; s < x.points.size(); ++s) {
        EXPECT_EQ(x.points[s].scale, y.points[s].scale) << where;
        // NaN ratios (both keys at 0) compare as equal here.
        EXPECT_TRUE(x.points[s].ratio == y.points[s].ratio ||
                    (std::isnan(x.points[s].ratio) && std::isnan(y.points[s].ratio)))
            << where << ", scale " << x.points[s].scale;
        EXPECT_EQ(x.points[s].stats.max_weight, y.points[s].stats.max_weight) << where;
      }
      ASSERT_EQ(x.weights.size(), y.weights.size()) << where;
      for (std::size_t s = 0; s < x.weights.size(); ++s) {
        EXPECT_EQ(x.weights[s], y.weights[s]) << where;
      }
    }
  }
  ASSERT_EQ(a.laws.size(), b.laws.size()) << what;
  for (std::size_t l = 0; l < a.laws.size(); ++l) {
    EXPECT_EQ(a.laws[l].variant, b.laws[l].variant) << what;
    EXPECT_EQ(a.laws[l].max_deviation, b.laws[l].max_deviation)
        << what << ", " << a.laws[l].variant;
    EXPECT_EQ(a.laws[l].points, b.laws[l].points) << what << ", " << a.laws[l].variant;
  }
}

TEST(HeadSource, SyntheticSourceDescribesItsModelAndHandsOutItsHeads) {
  const SynthOptions o = small_model();
  const HeadSource src = HeadSource::synthetic(o);
  EXPECT_EQ(src.name(), "synthetic");
  EXPECT_EQ(src.schema().path, "synthetic");
  EXPECT_EQ(src.schema().num_images, o.images);
  EXPECT_EQ(src.schema().attrs.num_layers, o.layers);
  EXPECT_EQ(src.schema().attrs.num_tokens, o.tokens());
  EXPECT_EQ(src.schema().attrs.scale, o.scale());
  EXPECT_EQ(src.schema().layer_has_attn, std::vector<bool>(2, false));
  EXPECT_EQ(src.schema().layer_has_out, std::vector<bool>(2, false));

  Selection sel;
  sel.images = {2, 0};
  sel.layers = {1};
  sel.transform = parse_query_transform("l2norm", 0);
  const Selection r = resolve(src.schema(), sel);
  std::set<std::tuple<int, int, int>> seen;
  std::vector<int> done;
  src.for_each_head(
      r,
      [&](const HeadView& h) {
        const ImageQKV want = synth_image(o, h.image);
        EXPECT_EQ(*h.q_raw, want.Q(h.layer, h.head)) << "image " << h.image << " head " << h.head;
        EXPECT_EQ(h.q, r.transform.apply<float>(want.Q(h.layer, h.head))) << "image " << h.image;
        EXPECT_EQ(h.k, want.K(h.layer, h.head)) << "image " << h.image << " head " << h.head;
        EXPECT_TRUE(seen.insert({h.image, h.layer, h.head}).second) << "head visited twice";
      },
      [&](int image) { done.push_back(image); });
  EXPECT_EQ(seen.size(), 4u);
  EXPECT_EQ(done, (std::vector<int>{2, 0}));
}

TEST(SpikinessRun, ReadsOnlySampledImagesAndEqualsFeedingEveryHead) {
  const SynthOptions o = small_model();
  const HeadSource src = HeadSource::synthetic(o);
  const Selection sel = resolve(src.schema(), Selection{});
  const std::vector<QuerySample> samples = {{1, 0, 1, 3}, {1, 1, 0, 0}, {3, 0, 0, 12}};
  ASSERT_EQ(sample_images(samples), (std::vector<int>{1, 3}));
  EXPECT_EQ(sample_images({{3, 0, 0, 1}, {0, 1, 1, 2}, {3, 1, 0, 0}}), (std::vector<int>{0, 3}))
      << "unsorted samples";

  std::vector<int> read;
  const SpikinessResult run = run_spikiness(src, sel, variants(), samples, sweep_options(), 2,
                                            [&](int image) { read.push_back(image); });
  EXPECT_EQ(read, (std::vector<int>{1, 3})) << "a run reads the images holding a sample, only";

  // The same sweep with every head of every image fed to the collector by hand.
  SpikinessCollector all(variants(), samples, o.scale(), sweep_options(), 2);
  for (int image = 0; image < o.images; ++image) {
    const ImageQKV img = synth_image(o, image);
    for (int l = 0; l < o.layers; ++l)
      for (int h = 0; h < o.heads; ++h) {
        all.add_head(HeadView{image, l, h, img.Q(l, h), img.K(l, h), img.V(l, h), &img.Q(l, h)});
      }
  }
  expect_same(run, all.finish(), "run vs every head");
  EXPECT_EQ(run.sweeps[0][0].weights.size(), 3u) << "keep_weights: the first samples keep rows";
  EXPECT_TRUE(run.sweeps[0][2].weights.empty());
  EXPECT_TRUE(has_ratio(run));
}

// A run computed image by image, in parts (as shards or ranks compute it), and folded by a
// collector in the selection's order, equals run_spikiness: sweeps, kept rows (counted from the
// run's first sample, whichever part computes it) and laws.
TEST(SpikinessRun, PartsOfImagesFoldToTheRun) {
  const SynthOptions o = small_model();
  const HeadSource src = HeadSource::synthetic(o);
  const Selection sel = resolve(src.schema(), Selection{});
  const std::vector<QuerySample> samples = {{0, 1, 1, 2}, {1, 0, 1, 3}, {1, 1, 0, 0}, {3, 0, 0, 12}};
  const std::vector<int> images = sample_images(samples);
  ASSERT_EQ(images, (std::vector<int>{0, 1, 3}));
  const SpikinessResult run = run_spikiness(src, sel, variants(), samples, sweep_options(), 3);
  for (std::size_t cut = 0; cut <= images.size(); ++cut) {
    std::vector<SpikinessImage> parts;
    const auto keep = [&parts](SpikinessImage&& img) { parts.push_back(std::move(img)); };
    spikiness_images(src, sel, variants(), samples, sweep_options(), 3,
                     {images.begin(), images.begin() + static_cast<long>(cut)}, keep);
    spikiness_images(src, sel, variants(), samples, sweep_options(), 3,
                     {images.begin() + static_cast<long>(cut), images.end()}, keep);
    ASSERT_EQ(parts.size(), images.size()) << "cut " << cut;
    EXPECT_EQ(parts[1].samples, (std::vector<std::size_t>{1, 2})) << "image 1 holds samples 1 and 2";
    EXPECT_EQ(parts[1].sweeps[0][1].weights.size(), 3u) << "sample 2 keeps its rows (keep_weights 3)";
    EXPECT_TRUE(parts[2].sweeps[0][0].weights.empty()) << "sample 3 does not";
    SpikinessCollector fold(variants(), samples, o.scale(), sweep_options(), 3);
    for (SpikinessImage& part : parts) fold.add_image(std::move(part));
    const SpikinessResult got = fold.finish();
    expect_same(run, got, "cut " + std::to_string(cut));
    for (std::size_t l = 0; l < run.laws.size(); ++l) {
      EXPECT_EQ(got.laws[l].queries, run.laws[l].queries) << run.laws[l].variant;
      EXPECT_EQ(got.laws[l].skipped, run.laws[l].skipped) << run.laws[l].variant;
      EXPECT_EQ(got.laws[l].law, run.laws[l].law) << run.laws[l].variant;
    }
  }
}

TEST(SpikinessRun, FoldRefusesMissingAndMisplacedImages) {
  const SynthOptions o = small_model();
  const HeadSource src = HeadSource::synthetic(o);
  const Selection sel = resolve(src.schema(), Selection{});
  const std::vector<QuerySample> samples = {{1, 0, 1, 3}, {3, 0, 0, 12}};
  std::vector<SpikinessImage> parts;
  spikiness_images(src, sel, variants(), samples, sweep_options(), 0, {1, 3},
                   [&parts](SpikinessImage&& img) { parts.push_back(std::move(img)); });
  ASSERT_EQ(parts.size(), 2u);
  SpikinessCollector missing(variants(), samples, o.scale(), sweep_options(), 0);
  missing.add_image(SpikinessImage(parts[0]));
  EXPECT_THROW((void)missing.finish(), Error) << "image 3 was never added";
  SpikinessCollector misplaced(variants(), samples, o.scale(), sweep_options(), 0);
  SpikinessImage wrong = parts[0];
  wrong.image = 3;  // names sample 0, which is in image 1
  EXPECT_THROW(misplaced.add_image(std::move(wrong)), Error);
}

class SpikinessRunDump : public test::ScratchDirTest {};

TEST_F(SpikinessRunDump, DumpAndSyntheticSourcesGiveTheSameSweeps) {
  const SynthOptions o = small_model();
  write_synth_dump(path("d.h5"), o);
  DumpReader reader(path("d.h5"));
  const HeadSource dump = HeadSource::dump(reader), synthetic = HeadSource::synthetic(o);
  EXPECT_EQ(dump.name(), "dump");
  EXPECT_EQ(dump.schema().path, path("d.h5"));
  const Selection sel = resolve(dump.schema(), Selection{});
  const auto samples = draw_samples(sel, o.tokens(), 20, 3);
  const SpikinessResult a = run_spikiness(dump, sel, variants(), samples, sweep_options(), 1);
  const SpikinessResult b = run_spikiness(synthetic, sel, variants(), samples, sweep_options(), 1);
  expect_same(a, b, "dump vs synthetic");
}

TEST(SpikinessMedians, MedianIgnoresNaN) {
  EXPECT_EQ(median_ignoring_nan({3.0, 1.0, 2.0}), 2.0);
  EXPECT_EQ(median_ignoring_nan({4.0, 1.0, kNaN, 2.0, 8.0}), 3.0);
  EXPECT_EQ(median_ignoring_nan({kNaN, 5.0}), 5.0);
  EXPECT_TRUE(std::isnan(median_ignoring_nan({kNaN, kNaN})));
  EXPECT_TRUE(std::isnan(median_ignoring_nan({})));
  EXPECT_EQ(median_ignoring_nan({std::numeric_limits<double>::infinity(), 1.0, 2.0}), 2.0);
}

// A result with two variants, three samples and two scales, its values chosen by hand.
SpikinessResult hand_result() {
  SpikinessResult r;
  r.variants = parse_variants("softmax,inline");
  r.samples = {{0, 0, 0, 0}, {0, 0, 0, 1}, {0, 0, 0, 2}};
  const double ratio[2][3][2] = {{{1, 10}, {3, 30}, {2, kNaN}},
                                 {{kNaN, kNaN}, {kNaN, kNaN}, {kNaN, kNaN}}};
  const double eff[2][3][2] = {{{5, 1}, {7, 2}, {6, 4}}, {{1, 1}, {2, 2}, {4, 4}}};
  r.sweeps.resize(2);
  for (int v = 0; v < 2; ++v) {
    for (int i = 0; i < 3; ++i) {
      QuerySweep s;
      for (int k = 0; k < 2; ++k) {
        SweepPoint p;
        p.scale = k == 0 ? 0.5 : 2.0;
        p.ratio = ratio[v][i][k];
        p.stats.effective_keys = eff[v][i][k];
        s.points.push_back(p);
      }
      r.sweeps[static_cast<std::size_t>(v)].push_back(s);
    }
  }
  return r;
}

TEST(SpikinessMedians, PerVariantAndScaleOverSamples) {
  const auto m = spikiness_medians(hand_result(), 2);
  ASSERT_EQ(m.size(), 2u);
  ASSERT_EQ(m[0].size(), 2u);
  EXPECT_EQ(m[0][0].scale, 0.5);
  EXPECT_EQ(m[0][0].ratio, 2.0);
  EXPECT_EQ(m[0][0].effective_keys, 6.0);
  EXPECT_EQ(m[0][1].scale, 2.0);
  EXPECT_EQ(m[0][1].ratio, 20.0) << "the NaN of sample 2 is left out";
  EXPECT_EQ(m[0][1].effective_keys, 2.0);
  EXPECT_TRUE(std::isnan(m[1][0].ratio)) << "no sample has a ratio";
  EXPECT_EQ(m[1][1].effective_keys, 2.0);
}

TEST(SpikinessMedians, HasRatioOnlyWhenOnePointHasOne) {
  SpikinessResult r = hand_result();
  EXPECT_TRUE(has_ratio(r));
  for (auto& s : r.sweeps[0])
    for (auto& p : s.points) p.ratio = kNaN;
  EXPECT_FALSE(has_ratio(r));
  r.sweeps[1][2].points[1].ratio = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(has_ratio(r)) << "an infinite ratio (lower weight 0) is a ratio";
}

}  // namespace
}  // namespace attnscope::analyses
