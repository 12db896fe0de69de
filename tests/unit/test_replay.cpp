// attnscope replay's forward pass (replay.hpp) on tiny random models against a plain-loop forward
// written here from docs/model-weights.md with the reference attention, for every family of the
// registry and every kind of intervention; and the controls an intervention must pass.
#include "attnscope/analyses/replay.hpp"
#include "attnscope/error.hpp"
#include "random_inputs.hpp"
#include "reference.hpp"
#include "variant_specs.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>

namespace attnscope::analyses {
namespace {

constexpr std::uint64_t kSeed = 777;

MatF rnd(int rows, int cols, std::uint64_t seed, double sd = 0.5) {
  return test::random_matrix(rows, cols, seed, 0.0, sd).cast<float>();
}
VecF rndv(int n, std::uint64_t seed, double sd = 0.5) { return rnd(n, 1, seed, sd).col(0); }

/// A model of 3x3 patches of size 2 (a 6x6 image, 2 channels), D = 4, 2 heads of 2, MLP 3, 2 blocks.
VitModel tiny(const std::string& spec, std::uint64_t seed) {
  VitModel m;
  m.model_name = "tiny";
  m.variant = parse_variant(spec, Convention::Code);
  m.scale = 1.0 / std::sqrt(2.0);
  m.image_size = 6, m.patch_size = 2, m.in_chans = 2, m.num_classes = 3;
  m.embed_dim = 4, m.depth = 2, m.num_heads = 2, m.head_dim = 2, m.mlp_hidden = 3;
  m.grid = TokenGrid{1, 3, 3};
  m.patch_w = rnd(4, 8, seed), m.patch_b = rndv(4, seed + 1), m.cls_token = rndv(4, seed + 2);
  m.pos_embed = rnd(10, 4, seed + 3);
  for (int l = 0; l < 2; ++l) {
    const std::uint64_t s = seed + 100 * static_cast<std::uint64_t>(l + 1);
    VitBlock b;
    b.norm1_w = rndv(4, s, 1.0), b.norm1_b = rndv(4, s + 1), b.qkv_w = rnd(12, 4, s + 2), b.qkv_b = rndv(12, s + 3);
    b.proj_w = rnd(4, 4, s + 4), b.proj_b = rndv(4, s + 5), b.norm2_w = rndv(4, s + 6, 1.0), b.norm2_b = rndv(4, s + 7);
    b.fc1_w = rnd(3, 4, s + 8), b.fc1_b = rndv(3, s + 9), b.fc2_w = rnd(4, 3, s + 10), b.fc2_b = rndv(4, s + 11);
    m.blocks.push_back(b);
  }
  m.norm_w = rndv(4, seed + 4, 1.0), m.norm_b = rndv(4, seed + 5), m.head_w = rnd(3, 4, seed + 6);
  m.head_b = rndv(3, seed + 7);
  return m;
}

double gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

/// Row-wise LayerNorm, plain loops.
MatD plain_ln(const MatD& x, const VecF& w, const VecF& b, double eps) {
  MatD y(x.rows(), x.cols());
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    double mean = 0.0, var = 0.0;
    for (Eigen::Index c = 0; c < x.cols(); ++c) mean += x(i, c) / static_cast<double>(x.cols());
    for (Eigen::Index c = 0; c < x.cols(); ++c) var += (x(i, c) - mean) * (x(i, c) - mean) / static_cast<double>(x.cols());
    for (Eigen::Index c = 0; c < x.cols(); ++c) y(i, c) = (x(i, c) - mean) / std::sqrt(var + eps) * w(c) + b(c);
  }
  return y;
}

/// y = x W^T + b, plain loops (W as stored: out x in).
MatD plain_linear(const MatD& x, const MatF& w, const VecF& b) {
  MatD y(x.rows(), w.rows());
  for (Eigen::Index i = 0; i < x.rows(); ++i)
    for (Eigen::Index o = 0; o < w.rows(); ++o) {
      double s = b(o);
      for (Eigen::Index t = 0; t < x.cols(); ++t) s += x(i, t) * w(o, t);
      y(i, o) = s;
    }
  return y;
}

/// The forward pass of docs/model-weights.md with the reference attention; the intervention in
/// every block.
VecD plain_forward(const VitModel& m, const VecF& image, int image_id, const Intervention& iv, std::uint64_t seed) {
  const int n = m.grid.tokens(), g = m.grid.height, p = m.patch_size, s = m.image_size, d = m.head_dim;
  MatD x(n, m.embed_dim);
  for (int c = 0; c < m.embed_dim; ++c) x(0, c) = m.cls_token(c) + m.pos_embed(0, c);
  for (int t = 0; t < g * g; ++t) {
    for (int c = 0; c < m.embed_dim; ++c) {
      double v = m.patch_b(c);
      for (int ch = 0; ch < m.in_chans; ++ch)
        for (int y = 0; y < p; ++y)
          for (int xx = 0; xx < p; ++xx)
            v += m.patch_w(c, (ch * p + y) * p + xx) * image((ch * s + (t / g) * p + y) * s + (t % g) * p + xx);
      x(1 + t, c) = v + m.pos_embed(1 + t, c);
    }
  }
  for (int l = 0; l < m.depth; ++l) {
    const VitBlock& b = m.blocks[static_cast<std::size_t>(l)];
    const MatD qkv = plain_linear(plain_ln(x, b.norm1_w, b.norm1_b, m.layer_norm_eps), b.qkv_w, b.qkv_b);
    MatD heads(n, m.embed_dim);
    for (int h = 0; h < m.num_heads; ++h) {
      MatD q = qkv.middleCols(h * d, d);
      if (!iv.transform.is_identity()) q = reference::query_transform(iv.transform, q);
      Mask mask;
      if (iv.mask) mask = build_mask(*iv.mask, m.grid, mask_seed(seed, image_id, l, h));
      heads.middleCols(h * d, d) = reference::outputs(iv.family ? *iv.family : m.variant, q,
                                                      qkv.middleCols(m.embed_dim + h * d, d),
                                                      qkv.middleCols(2 * m.embed_dim + h * d, d), m.scale,
                                                      iv.mask ? &mask : nullptr);
    }
    x += plain_linear(heads, b.proj_w, b.proj_b);
    MatD hidden = plain_linear(plain_ln(x, b.norm2_w, b.norm2_b, m.layer_norm_eps), b.fc1_w, b.fc1_b);
    for (Eigen::Index i = 0; i < hidden.rows(); ++i)
      for (Eigen::Index c = 0; c < hidden.cols(); ++c) hidden(i, c) = gelu(hidden(i, c));
    x += plain_linear(hidden, b.fc2_w, b.fc2_b);
  }
  return plain_linear(plain_ln(x.topRows(1), m.norm_w, m.norm_b, m.layer_norm_eps), m.head_w, m.head_b)
      .row(0)
      .transpose();
}

class ReplayEveryFamily : public ::testing::TestWithParam<std::string> {};

TEST_P(ReplayEveryFamily, EqualsThePlainForwardUnderEveryIntervention) {
  const VitModel m = tiny(GetParam(), kSeed);
  const MatF images = rnd(3, 72, kSeed + 9, 1.0);
  const std::vector<int> ids{0, 5, 9};
  for (const Intervention& iv :
       parse_interventions("none,local:1,local:3,random:2,f1,f2,l2norm,family=softmax,family=mala", m, kSeed)) {
    ReplayOptions o;
    o.seed = 3;
    const MatF got = replay_logits(m, images, ids, iv, o);
    for (int i = 0; i < 3; ++i) {
      const VecD want = plain_forward(m, images.row(i).transpose(), ids[static_cast<std::size_t>(i)], iv, o.seed);
      const double tol = 1e-5 * std::max(1.0, want.cwiseAbs().maxCoeff());  // float logits
      for (int c = 0; c < 3; ++c) {
        EXPECT_NEAR(got(i, c), want(c), tol) << GetParam() << " " << iv.name << " image " << i << " class " << c;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, ReplayEveryFamily, ::testing::ValuesIn(test::all_variant_specs()),
                         [](const ::testing::TestParamInfo<std::string>& p) { return test::param_name(p.param); });

/// `m` with InLine's local residual in every block (random grouped 1x1 convolutions).
VitModel with_local_residual(VitModel m, std::uint64_t seed) {
  m.local_residual = true;
  const int dim = m.embed_dim, per = m.head_dim;
  for (VitBlock& b : m.blocks) {
    b.lr_conv1_w = rnd(dim, per, ++seed), b.lr_conv1_b = rndv(dim, ++seed);
    b.lr_conv2_w = rnd(9 * dim, per, ++seed), b.lr_conv2_b = rndv(9 * dim, ++seed);
  }
  return m;
}

/// A model of DeiT-T's token count (14 x 14 + CLS from 28 x 28 images, patch 2), narrower:
/// `heads` heads of `head_dim` (3 of 16 by default), MLP 96, 3 blocks. Every tile and remainder of
/// the packed products.
VitModel deit_tokens(const std::string& spec, std::uint64_t seed, int heads = 3, int head_dim = 16) {
  const int dim = heads * head_dim;
  VitModel m;
  m.model_name = "deit-tokens";
  m.variant = parse_variant(spec, Convention::Code);
  m.scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  m.image_size = 28, m.patch_size = 2, m.in_chans = 1, m.num_classes = 10;
  m.embed_dim = dim, m.depth = 3, m.num_heads = heads, m.head_dim = head_dim, m.mlp_hidden = 96;
  m.grid = TokenGrid{1, 14, 14};
  m.patch_w = rnd(dim, 4, seed), m.patch_b = rndv(dim, seed + 1), m.cls_token = rndv(dim, seed + 2);
  m.pos_embed = rnd(197, dim, seed + 3);
  for (int l = 0; l < m.depth; ++l) {
    const std::uint64_t s = seed + 100 * static_cast<std::uint64_t>(l + 1);
    VitBlock b;
    b.norm1_w = rndv(dim, s, 1.0), b.norm1_b = rndv(dim, s + 1), b.qkv_w = rnd(3 * dim, dim, s + 2, 0.3);
    b.qkv_b = rndv(3 * dim, s + 3), b.proj_w = rnd(dim, dim, s + 4, 0.2), b.proj_b = rndv(dim, s + 5);
    b.norm2_w = rndv(dim, s + 6, 1.0), b.norm2_b = rndv(dim, s + 7), b.fc1_w = rnd(96, dim, s + 8, 0.2);
    b.fc1_b = rndv(96, s + 9), b.fc2_w = rnd(dim, 96, s + 10, 0.2), b.fc2_b = rndv(dim, s + 11);
    m.blocks.push_back(b);
  }
  m.norm_w = rndv(dim, seed + 4, 1.0), m.norm_b = rndv(dim, seed + 5), m.head_w = rnd(10, dim, seed + 6);
  m.head_b = rndv(10, seed + 7);
  return m;
}

/// The fast forward pass (the default) and the plain one (ReplayOptions::reference) give the same
/// logits, bit for bit, under every intervention, on every block or some.
void expect_fast_equals_reference(const VitModel& m, const MatF& images, const std::vector<int>& ids,
                                  const std::string& interventions) {
  const ReplayModel prepared(m);
  for (const Intervention& iv : parse_interventions(interventions, m, kSeed)) {
    for (const std::vector<int>& layers : {std::vector<int>{}, std::vector<int>{m.depth - 1}, std::vector<int>{0}}) {
      ReplayOptions fast, plain;
      fast.seed = plain.seed = 3;
      fast.layers = plain.layers = layers;
      plain.reference = true;
      const MatF got = replay_logits(prepared, images, ids, iv, fast);
      const MatF want = replay_logits(prepared, images, ids, iv, plain);
      ASSERT_EQ(got.rows(), want.rows());
      for (Eigen::Index i = 0; i < got.rows(); ++i) {
        for (Eigen::Index c = 0; c < got.cols(); ++c) {
          EXPECT_EQ(std::bit_cast<std::uint32_t>(got(i, c)), std::bit_cast<std::uint32_t>(want(i, c)))
              << m.variant.name() << " " << iv.name << " layers " << layers.size() << " image " << i << " class " << c
              << ": " << got(i, c) << " vs " << want(i, c);
        }
      }
    }
  }
}

TEST_P(ReplayEveryFamily, FastForwardEqualsThePlainOneBitForBit) {
  const MatF images = rnd(3, 72, kSeed + 9, 1.0);
  const std::string all = "none,local:1,local:3,random:2,f1,f2,l2norm,family=softmax,family=mala,family=linear:relu";
  expect_fast_equals_reference(tiny(GetParam(), kSeed), images, {0, 5, 9}, all);
  expect_fast_equals_reference(with_local_residual(tiny(GetParam(), kSeed), kSeed + 50), images, {0, 5, 9}, "none,local:3");
}

TEST(Replay, FastForwardEqualsThePlainOneAtDeitTokens) {
  const MatF images = rnd(3, 784, kSeed + 10, 1.0);
  for (const char* spec : {"softmax", "linear:relu", "inline", "mala", "efficient", "cosformer"}) {
    const VitModel m = deit_tokens(spec, kSeed + 20);
    expect_fast_equals_reference(m, images, {0, 1, 2}, "none,local:3,random:9,f2,family=softmax");
    expect_fast_equals_reference(with_local_residual(m, kSeed + 60), images.topRows(1), {4}, "none");
  }
  // Heads of 64 (DeiT-T's): relu_affine's features of the CLS row alone would differ in their last
  // bits from those among every row (query_features_row_local); the fast pass computes them all.
  for (const char* spec : {"linear:relu_affine=7", "inline:relu_affine=7", "softmax"}) {
    expect_fast_equals_reference(deit_tokens(spec, kSeed + 30, 2, 64), images.topRows(2), {0, 1},
                                 "none,family=mala:relu_affine=7");
  }
}

// --attention float: the softmax heads without a mask in float. The logits stay within 1e-5 of
// the plain (double) pass's, relative to the largest (the target replay's speed is measured
// against: PyTorch's float logits); they are not the same bits (the control that the option acts);
// masked heads and kernel families are still computed in double, bit for bit.
TEST(Replay, FloatAttentionStaysWithin1e5OfThePlainLogits) {
  const MatF images = rnd(3, 784, kSeed + 11, 1.0);
  for (const auto& [spec, head_dim] : {std::pair<const char*, int>{"softmax", 16}, {"softmax", 64}}) {
    const VitModel m = deit_tokens(spec, kSeed + 40, 3, head_dim);
    const ReplayModel prepared(m);
    for (const Intervention& iv : parse_interventions("none,f2,family=softmax", m, kSeed)) {
      ReplayOptions in_float, plain;
      in_float.float_attention = true;
      plain.reference = true;
      const MatF got = replay_logits(prepared, images, {0, 1, 2}, iv, in_float);
      const MatF want = replay_logits(prepared, images, {0, 1, 2}, iv, plain);
      const double top = want.cwiseAbs().maxCoeff();
      const double worst = (got.cast<double>() - want.cast<double>()).cwiseAbs().maxCoeff();
      EXPECT_LE(worst, 1e-5 * top) << spec << " d " << head_dim << " " << iv.name;
      EXPECT_GT(worst, 0.0) << spec << " d " << head_dim << " " << iv.name << ": the option changed nothing";
    }
  }
  // Masked softmax heads (local:3) and the kernel families: double, the plain pass's bits.
  for (const char* spec : {"softmax", "inline", "mala", "linear:relu"}) {
    const VitModel m = deit_tokens(spec, kSeed + 41);
    const ReplayModel prepared(m);
    const std::string ivs = std::string(spec) == "softmax" ? "local:3" : "none,local:3";
    for (const Intervention& iv : parse_interventions(ivs, m, kSeed)) {
      ReplayOptions in_float, plain;
      in_float.float_attention = true;
      plain.reference = true;
      const MatF got = replay_logits(prepared, images, {0, 1, 2}, iv, in_float);
      const MatF want = replay_logits(prepared, images, {0, 1, 2}, iv, plain);
      for (Eigen::Index i = 0; i < got.rows(); ++i)
        for (Eigen::Index c = 0; c < got.cols(); ++c)
          EXPECT_EQ(std::bit_cast<std::uint32_t>(got(i, c)), std::bit_cast<std::uint32_t>(want(i, c)))
              << spec << " " << iv.name << " image " << i << " class " << c;
    }
  }
}

// With the attention's output projection at zero the attention cannot reach the logits: no
// intervention may change them (the control); with it restored, every one does.
TEST(Replay, InterventionsActOnlyThroughTheAttention) {
  VitModel m = tiny("softmax", kSeed);
  const MatF images = rnd(2, 72, kSeed + 1, 1.0);
  const auto ivs = parse_interventions("none,local:3,random:4,f1,family=linear:relu", m, 0);
  const auto run = [&](const VitModel& model, const Intervention& iv) {
    return replay_logits(model, images, {0, 1}, iv, ReplayOptions{});
  };
  for (std::size_t i = 1; i < ivs.size(); ++i) {
    EXPECT_GT((run(m, ivs[i]) - run(m, ivs[0])).cwiseAbs().maxCoeff(), 1e-6) << ivs[i].name;
  }
  for (VitBlock& b : m.blocks) b.proj_w.setZero();
  for (const Intervention& iv : ivs) EXPECT_EQ(run(m, iv), run(m, ivs[0])) << iv.name;
}

// --layers restricts the intervention: in block 1 only, block 0's attention is the model's own.
TEST(Replay, LayersRestrictTheIntervention) {
  const VitModel m = tiny("inline", kSeed);
  const MatF images = rnd(2, 72, kSeed + 2, 1.0);
  const Intervention f1 = parse_interventions("f1", m, 0).front();
  ReplayOptions all, second;
  second.layers = {1};
  const MatF none = replay_logits(m, images, {0, 1}, parse_interventions("none", m, 0).front(), all);
  const MatF everywhere = replay_logits(m, images, {0, 1}, f1, all);
  const MatF in_second = replay_logits(m, images, {0, 1}, f1, second);
  EXPECT_GT((everywhere - in_second).cwiseAbs().maxCoeff(), 1e-6);
  EXPECT_GT((in_second - none).cwiseAbs().maxCoeff(), 1e-6);
  second.layers = {2};
  EXPECT_THROW((void)replay_logits(m, images, {0, 1}, f1, second), UsageError);
}

TEST(Replay, RefusesImagesThatDoNotFitAndBadInterventions) {
  const VitModel m = tiny("softmax", kSeed);
  EXPECT_THROW((void)replay_logits(m, rnd(1, 71, 1), {0}, Intervention{}, {}), UsageError);
  for (const char* bad : {"blur", "local:4", "family=nope", "f1,f1", "", "none,"}) {
    EXPECT_THROW((void)parse_interventions(bad, m, 0), UsageError) << "'" << bad << "'";
  }
}

}  // namespace
}  // namespace attnscope::analyses
