// Attention rollout: the fast path (fixed-order products) against the plain loops on every family
// and every fusion; exact answers where they are known (self-attention gives the identity; uniform
// rows give I / 2^L + (1 - 1/2^L) U); the layer order matters (a negative control: reversed layers
// give another product); max and min fusion on a hand example; rows without mass replaced by the
// identity's and counted; layers taken in the model's order; a budget too small for an image's
// heads takes the layers one at a time and gives the same bits.
#include "attnscope/analyses/rollout.hpp"
#include "attnscope/attention.hpp"
#include "attnscope/dump.hpp"
#include "attnscope/error.hpp"
#include "attnscope/synth.hpp"
#include "attnscope/variant.hpp"
#include "float_rows_bound.hpp"
#include "random_inputs.hpp"
#include "scratch_dir.hpp"
#include "tolerances.hpp"
#include "variant_specs.hpp"

#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <utility>

namespace attnscope::analyses {
namespace {

/// Fast vs reference: L products of N-term sums of entries bounded by the rows' magnitudes.
constexpr double kRolloutTol = test::kDoubleTol;

MatD to_double(const MatF& x) {
  MatD out(x.rows(), x.cols());
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    for (Eigen::Index j = 0; j < x.cols(); ++j) out(i, j) = static_cast<double>(x(i, j));
  }
  return out;
}

std::vector<std::vector<MatD>> random_layers(const Variant& v, int n, int d, int layers, int heads,
                                             std::uint64_t seed) {
  const double mean = test::input_mean(v);
  std::vector<std::vector<MatD>> out(static_cast<std::size_t>(layers));
  for (int l = 0; l < layers; ++l) {
    for (int h = 0; h < heads; ++h) {
      const std::uint64_t s = seed + 10 * static_cast<std::uint64_t>(l * heads + h);
      const MatF q = test::random_matrix(n, d, s, mean).cast<float>();
      const MatF k = test::random_matrix(n, d, s + 1, mean).cast<float>();
      out[static_cast<std::size_t>(l)].push_back(attention_weights<double>(
          v, to_double(q), to_double(k), 1.0 / std::sqrt(static_cast<double>(d))));
    }
  }
  return out;
}

TEST(Rollout, FastMatchesReferenceOnEveryFamily) {
  for (const std::string& spec : test::all_variant_specs()) {
    const Variant v = parse_variant(spec, Convention::Paper, 4);
    for (int n : {1, 2, 63}) {
      for (int d : {1, 60}) {
        const auto layers = random_layers(v, n, d, 3, 2, 71);
        for (HeadFusion fusion : {HeadFusion::Mean, HeadFusion::Max, HeadFusion::Min}) {
          const std::string what = spec + " N=" + std::to_string(n) + " d=" + std::to_string(d) +
                                   " " + to_string(fusion);
          int fixed_fast = 0, fixed_ref = 0;
          const MatD fast = rollout(layers, fusion, &fixed_fast);
          const MatD ref = rollout_reference(layers, fusion, &fixed_ref);
          EXPECT_EQ(fixed_fast, fixed_ref) << what;
          const double bound = std::max(1.0, ref.cwiseAbs().maxCoeff());
          EXPECT_LE((fast - ref).cwiseAbs().maxCoeff(), kRolloutTol * bound * n) << what;
          int fixed_cls = 0;
          const VecD cls = rollout_cls_row(layers, fusion, &fixed_cls);
          EXPECT_EQ(fixed_cls, fixed_ref) << what;
          EXPECT_LE((cls.transpose() - ref.row(0)).cwiseAbs().maxCoeff(), kRolloutTol * bound * n)
              << what << " (CLS row)";
          // Every step's rows sum to 1, so R's do (signed weights included).
          for (Eigen::Index i = 0; i < fast.rows(); ++i) {
            EXPECT_NEAR(fast.row(i).sum(), 1.0, 1e-9 * std::max(1.0, fast.row(i).cwiseAbs().sum()))
                << what;
          }
        }
      }
    }
  }
  // N = 197 (DeiT-T), 12 layers, 3 heads, on two families.
  for (const char* spec : {"softmax", "inline@code"}) {
    const auto layers = random_layers(parse_variant(spec), 197, 64, 12, 3, 5);
    const MatD fast = rollout(layers, HeadFusion::Mean);
    const MatD ref = rollout_reference(layers, HeadFusion::Mean);
    EXPECT_LE((fast - ref).cwiseAbs().maxCoeff(), kRolloutTol) << spec;
    EXPECT_LE(
        (rollout_cls_row(layers, HeadFusion::Mean).transpose() - ref.row(0)).cwiseAbs().maxCoeff(),
        kRolloutTol)
        << spec << " (CLS row)";
  }
}

TEST(Rollout, SelfAttentionIsTheIdentityAndUniformRowsHaveAClosedForm) {
  for (int n : {1, 2, 63, 197}) {
    const std::vector<std::vector<MatD>> self(4, std::vector<MatD>(3, MatD::Identity(n, n)));
    EXPECT_EQ(rollout(self, HeadFusion::Mean), MatD::Identity(n, n)) << n;
    // U = 1 1^T / N is idempotent: ((U + I) / 2)^L = I / 2^L + (1 - 1/2^L) U.
    const MatD u = MatD::Constant(n, n, 1.0 / n);
    for (int layers : {1, 2, 6}) {
      const std::vector<std::vector<MatD>> uniform(static_cast<std::size_t>(layers),
                                                   std::vector<MatD>(2, u));
      const double p = std::ldexp(1.0, -layers);
      const MatD want = p * MatD::Identity(n, n) + (1.0 - p) * u;
      EXPECT_LE((rollout(uniform, HeadFusion::Mean) - want).cwiseAbs().maxCoeff(), 1e-14)
          << n << " " << layers;
    }
  }
}

TEST(Rollout, LayersAreMultipliedLastOnTheLeft) {
  // Layer 0 sends every token to token 1, layer 1 sends every token to token 2 (rows one-hot).
  const int n = 4;
  MatD to1 = MatD::Zero(n, n), to2 = MatD::Zero(n, n);
  to1.col(1).setOnes();
  to2.col(2).setOnes();
  const MatD a0 = rollout_step({to1}, HeadFusion::Mean), a1 = rollout_step({to2}, HeadFusion::Mean);
  const MatD forward = rollout({{to1}, {to2}}, HeadFusion::Mean);
  const MatD backward = rollout({{to2}, {to1}}, HeadFusion::Mean);
  EXPECT_LE((forward - a1 * a0).cwiseAbs().maxCoeff(), 1e-15);
  EXPECT_GT((forward - backward).cwiseAbs().maxCoeff(), 0.1) << "the order of layers must matter";
  // CLS reads half of itself and half of token 2 in the last layer; each of those read half of
  // itself and half of token 1 in the first: 1/4 CLS, 1/2 token 1, 1/4 token 2.
  EXPECT_DOUBLE_EQ(forward(0, 0), 0.25);
  EXPECT_DOUBLE_EQ(forward(0, 1), 0.5);
  EXPECT_DOUBLE_EQ(forward(0, 2), 0.25);
  EXPECT_DOUBLE_EQ(backward(0, 1), 0.25);
  EXPECT_DOUBLE_EQ(backward(0, 2), 0.5);
}

TEST(Rollout, FusionsAndRowsWithoutMass) {
  MatD a(2, 2), b(2, 2);
  a << 0.9, 0.1, 0.3, 0.7;
  b << 0.5, 0.5, 0.6, 0.4;
  const MatD mx = rollout_step({a, b}, HeadFusion::Max);  // [[0.9, 0.5], [0.6, 0.7]] + I
  EXPECT_DOUBLE_EQ(mx(0, 0), 1.9 / 2.4);
  EXPECT_DOUBLE_EQ(mx(1, 0), 0.6 / 2.3);
  const MatD mn = rollout_step({a, b}, HeadFusion::Min);  // [[0.5, 0.1], [0.3, 0.4]] + I
  EXPECT_DOUBLE_EQ(mn(0, 1), 0.1 / 1.6);
  const MatD me = rollout_step({a, b}, HeadFusion::Mean);  // [[0.7, 0.3], [0.45, 0.55]] + I
  EXPECT_DOUBLE_EQ(me(1, 1), 1.55 / 2.0);
  // A signed row summing to -1 (as InLine's can under min fusion): + I gives 0, replaced.
  MatD s(2, 2);
  s << -1.5, 0.5, 0.2, 0.8;
  int fixed = 0, fixed_ref = 0;
  const MatD step = rollout_step({s}, HeadFusion::Mean, &fixed);
  EXPECT_EQ(fixed, 1);
  EXPECT_EQ(step(0, 0), 1.0);
  EXPECT_EQ(step(0, 1), 0.0);
  (void)rollout_reference({{s}}, HeadFusion::Mean, &fixed_ref);
  EXPECT_EQ(fixed_ref, 1);
  EXPECT_THROW((void)parse_head_fusion("median"), UsageError);
  EXPECT_EQ(parse_head_fusion("max"), HeadFusion::Max);
}

TEST(Rollout, LayersInTheModelsOrder) {
  DumpSchema schema;
  schema.attrs.num_layers = 3;
  schema.source_layers = {2, 0, 1};  // /layers/0 is model layer 2
  EXPECT_EQ(layers_in_model_order(schema, {0, 1, 2}), (std::vector<int>{1, 2, 0}));
  schema.source_layers.clear();
  EXPECT_EQ(layers_in_model_order(schema, {2, 0}), (std::vector<int>{0, 2}));
}

class RolloutRunTest : public test::ScratchDirTest {
 protected:
  /// Writes d.h5: o's synthetic images, each changed by `edit` first when given.
  void write_dump(const SynthOptions& o, const std::function<void(ImageQKV&)>& edit = {}) {
    DumpWriter writer(path("d.h5"), o.attributes(), DumpWriterOptions{});
    for (int i = 0; i < o.images; ++i) {
      ImageQKV img = synth_image(o, i);
      if (edit) edit(img);
      writer.append(img);
    }
    writer.close();
  }

  /// The selection twice: with a --max-memory that holds every head of two images in flight
  /// (each with its heads and layer steps), and with one byte less, which takes a layer at a time.
  static std::pair<Selection, Selection> both_ways(const DumpReader& reader, const Selection& sel,
                                                   std::size_t variants) {
    Selection whole = resolve(reader.schema(), sel);
    Selection by_layer = whole;
    const double n = reader.schema().attrs.num_tokens;
    const double layers = static_cast<double>(whole.layers.size());
    const double heads = static_cast<double>(whole.heads.size());
    const auto all_heads =
        static_cast<std::size_t>(2 * 8.0 * n * n * (layers * heads + layers) * static_cast<double>(variants));
    whole.max_memory = all_heads + (std::size_t{1} << 20);
    by_layer.max_memory = all_heads - 1;
    EXPECT_TRUE(rollout_holds_every_head(reader.schema(), whole, variants, false));
    EXPECT_FALSE(rollout_holds_every_head(reader.schema(), by_layer, variants, false));
    return {whole, by_layer};
  }

  /// The same images, CLS rows bit for bit and counts, from both ways.
  static void expect_same_bits(const std::vector<RolloutImage>& a, const std::vector<RolloutImage>& b,
                               const std::vector<Variant>& variants, const SynthOptions& o,
                               const std::string& how) {
    ASSERT_EQ(a.size(), static_cast<std::size_t>(o.images)) << how;
    ASSERT_EQ(b.size(), a.size()) << how;
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].image, b[i].image);
      ASSERT_EQ(a[i].cls.size(), variants.size());
      for (std::size_t v = 0; v < variants.size(); ++v) {
        const std::string where = variants[v].name() + " " + how + " image " + std::to_string(a[i].image);
        ASSERT_EQ(a[i].cls[v].size(), static_cast<std::size_t>(o.tokens())) << where;
        EXPECT_EQ(a[i].cls[v], b[i].cls[v]) << where;  // bit for bit
        EXPECT_EQ(a[i].fixed_rows[v], b[i].fixed_rows[v]) << where;
        EXPECT_EQ(a[i].degenerate_rows[v], b[i].degenerate_rows[v]) << where;
      }
    }
  }
};

SynthOptions small_synth(int layers, int images, std::uint64_t seed) {
  SynthOptions o;
  o.layers = layers;
  o.heads = 3;
  o.grid = TokenGrid{1, 5, 6};
  o.head_dim = 7;
  o.images = images;
  o.seed = seed;
  return o;
}

std::vector<RolloutImage> run(DumpReader& reader, const Selection& sel, const std::vector<Variant>& variants,
                              HeadFusion fusion) {
  std::vector<RolloutImage> out;
  rollout_images(reader, sel, variants, fusion, false,
                 [&](RolloutImage&& img) { out.push_back(std::move(img)); });
  return out;
}

// Under a --max-memory too small for an image's heads, rollout_images takes the layers one at a
// time (last first): the same CLS rows, bit for bit, and the same counts, for every family, with
// layers selected out of the model's order and a head subset, whatever the threads of the run
// that holds every head.
TEST_F(RolloutRunTest, LayerAtATimeGivesTheSameBitsAsEveryHeadAtOnce) {
  const SynthOptions o = small_synth(4, 3, 11);
  write_dump(o);
  std::vector<Variant> variants;
  for (const std::string& spec : test::all_variant_specs()) variants.push_back(parse_variant(spec));
  DumpReader reader(path("d.h5"));
  Selection sel;
  sel.layers = {3, 0, 2};
  sel.heads = {2, 0};
  const auto [whole, by_layer] = both_ways(reader, sel, variants.size());
  EXPECT_TRUE(rollout_holds_every_head(reader.schema(), by_layer, variants.size(), true)) << "--reference holds them";
  const int initial_threads = omp_get_max_threads();
  // Every head at once keeps two images in flight, each layer's step formed by whichever thread
  // finishes its last head: one thread, and more threads than heads of a layer.
  for (const auto& [fusion, threads] : {std::pair{HeadFusion::Mean, 1}, std::pair{HeadFusion::Mean, 3},
                                        std::pair{HeadFusion::Max, 2}, std::pair{HeadFusion::Min, 3}}) {
    omp_set_num_threads(threads);
    const std::vector<RolloutImage> a = run(reader, whole, variants, fusion);
    omp_set_num_threads(initial_threads);
    expect_same_bits(a, run(reader, by_layer, variants, fusion), variants, o,
                     "fusion " + to_string(fusion) + ", " + std::to_string(threads) + " threads");
  }
}

// A layer whose heads are not all in the float range (one head's queries 1000 times larger: its
// logit error bound above kDiagnosticLogitError, so its weights come from the double path while
// the layer's other heads keep their float exponentials): every head at once gives the same bits
// as the layers one at a time, which widen every head to double before the step.
TEST_F(RolloutRunTest, ALayerWithHeadsOutsideTheFloatRangeGivesTheSameBitsAsALayerAtATime) {
  const SynthOptions o = small_synth(3, 2, 5);
  const auto at = [](const ImageQKV& img, int layer, int head) {
    return static_cast<std::size_t>(layer * img.heads + head);
  };
  write_dump(o, [&](ImageQKV& img) { img.q[at(img, 1, 1)] *= 1000.0f; });
  const std::vector<Variant> variants = {parse_variant("softmax"), parse_variant("softmax@code")};
  DumpReader reader(path("d.h5"));
  const auto [whole, by_layer] = both_ways(reader, Selection{}, variants.size());
  for (HeadFusion fusion : {HeadFusion::Mean, HeadFusion::Max, HeadFusion::Min}) {
    expect_same_bits(run(reader, whole, variants, fusion), run(reader, by_layer, variants, fusion), variants, o,
                     "fusion " + to_string(fusion));
  }
  // The layer is mixed: the scaled head outside the float range, its neighbour inside.
  const double s = reader.schema().attrs.scale;
  const ImageQKV img = synth_image(o, 0);
  const MatF big = img.q[at(img, 1, 1)] * 1000.0f;
  EXPECT_FALSE(test::float_rows_bound(variants[0], big, img.k[at(img, 1, 1)], s).used);
  EXPECT_TRUE(test::float_rows_bound(variants[0], img.q[at(img, 1, 0)], img.k[at(img, 1, 0)], s).used);
}

}  // namespace
}  // namespace attnscope::analyses
