// The C++ ViT forward pass with interventions (replay.hpp).
#include "attnscope/analyses/replay.hpp"

#include "attnscope/analyses/head_error.hpp"
#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"
#include "attnscope/parallel.hpp"
#include "attnscope/text.hpp"

#include <algorithm>
#include <limits>
#include <cmath>

namespace attnscope::analyses {
namespace {

/// The model's tensors, prepared once per run: the dense layers' matrices transposed (rows in,
/// columns out) in float, as the exporting framework multiplies them; vectors in double.
struct Block {
  VecD n1w, n1b, qkvb, projb, n2w, n2b, fc1b, fc2b;
  MatF qkvT, projT, fc1T, fc2T;
};
struct Weights {
  MatF patchT;  ///< (C P P) x D
  VecD patchb, cls;
  MatD pos;
  std::vector<Block> blocks;
  VecD nw, nb, headb;
  MatF headT;
};

Weights prepare(const VitModel& m) {
  Weights w;
  w.patchT = m.patch_w.transpose();
  w.patchb = m.patch_b.cast<double>();
  w.cls = m.cls_token.cast<double>();
  w.pos = m.pos_embed.cast<double>();
  for (const VitBlock& b : m.blocks) {
    Block o;
    o.n1w = b.norm1_w.cast<double>(), o.n1b = b.norm1_b.cast<double>();
    o.qkvT = b.qkv_w.transpose(), o.qkvb = b.qkv_b.cast<double>();
    o.projT = b.proj_w.transpose(), o.projb = b.proj_b.cast<double>();
    o.n2w = b.norm2_w.cast<double>(), o.n2b = b.norm2_b.cast<double>();
    o.fc1T = b.fc1_w.transpose(), o.fc1b = b.fc1_b.cast<double>();
    o.fc2T = b.fc2_w.transpose(), o.fc2b = b.fc2_b.cast<double>();
    w.blocks.push_back(std::move(o));
  }
  w.nw = m.norm_w.cast<double>(), w.nb = m.norm_b.cast<double>();
  w.headT = m.head_w.transpose(), w.headb = m.head_b.cast<double>();
  return w;
}

/// LayerNorm of every row (biased variance, as PyTorch).
MatD layer_norm(const MatD& x, const VecD& w, const VecD& b, double eps) {
  MatD y(x.rows(), x.cols());
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    const double mean = x.row(i).mean();
    const double var = (x.row(i).array() - mean).square().mean();
    y.row(i) = ((x.row(i).array() - mean) / std::sqrt(var + eps)).matrix().cwiseProduct(w.transpose()) +
               b.transpose();
  }
  return y;
}

/// x W^T + b with W^T given: the product in float (as the exporting framework's float32 layers
/// compute it, and twice as fast as double), the rest in double.
MatD affine(const MatD& x, const MatF& wT, const VecD& b) {
  const MatF xf = x.cast<float>();
  MatD y = (xf * wT).cast<double>();
  y.rowwise() += b.transpose();
  return y;
}

/// The patch tokens of one image (C*H*W, row-major per channel) as rows of C*P*P values in the
/// convolution kernel's (c, y, x) order, grid row by row.
MatD patches(const VitModel& m, const float* image) {
  const int g = m.grid.height, p = m.patch_size, c = m.in_chans, s = m.image_size;
  MatD out(g * g, c * p * p);
  for (int py = 0; py < g; ++py)
    for (int px = 0; px < g; ++px)
      for (int ch = 0; ch < c; ++ch)
        for (int y = 0; y < p; ++y)
          for (int x = 0; x < p; ++x) {
            out(py * g + px, (ch * p + y) * p + x) =
                static_cast<double>(image[(static_cast<std::ptrdiff_t>(ch) * s + py * p + y) * s + px * p + x]);
          }
  return out;
}

double gelu(double t) { return 0.5 * t * (1.0 + std::erf(t * M_SQRT1_2)); }  // exact GELU

/// y = grouped 1x1 convolution of x (groups = heads): output o reads the inputs of its group.
VecD grouped(const MatF& w, const VecF& b, const VecD& x, int groups) {
  const auto out_per = w.rows() / groups, in_per = w.cols();
  VecD y(w.rows());
  for (Eigen::Index o = 0; o < w.rows(); ++o) {
    y(o) = static_cast<double>(b(o)) +
           w.row(o).cast<double>().dot(x.segment((o / out_per) * in_per, in_per).transpose());
  }
  return y;
}

/// InLine's local residual (eq. 6) added to the grid tokens of the attention output `heads`
/// (N x D): kernels from the mean of the attention input h over all tokens, then each channel of
/// V's grid tokens filtered with its own 3 x 3 kernel (zero padding); prefix tokens get none.
void add_local_residual(const VitModel& m, const VitBlock& b, const MatD& h, const MatD& v, MatD& heads) {
  const VecD mean = h.colwise().mean().transpose();
  VecD hidden = grouped(b.lr_conv1_w, b.lr_conv1_b, mean, m.num_heads);
  for (Eigen::Index i = 0; i < hidden.size(); ++i) hidden(i) = gelu(hidden(i));
  const VecD kernels = grouped(b.lr_conv2_w, b.lr_conv2_b, hidden, m.num_heads);  // channel c: 9c..9c+8
  const int g = m.grid.height, p = m.grid.prefix;
  for (int ch = 0; ch < m.embed_dim; ++ch) {
    for (int r = 0; r < g; ++r) {
      for (int c = 0; c < g; ++c) {
        double s = 0.0;
        for (int i = 0; i < 3; ++i) {
          for (int j = 0; j < 3; ++j) {
            const int rr = r + i - 1, cc = c + j - 1;
            if (rr < 0 || rr >= g || cc < 0 || cc >= g) continue;
            s += kernels(9 * ch + 3 * i + j) * v(p + rr * g + cc, ch);
          }
        }
        heads(p + r * g + c, ch) += s;
      }
    }
  }
}

VecD forward(const VitModel& m, const Weights& w, const float* image, int image_id, const Intervention& iv,
             const ReplayOptions& o) {
  const int n = m.grid.tokens(), dim = m.embed_dim, d = m.head_dim;
  MatD x(n, dim);
  x.row(0) = w.cls.transpose();
  x.bottomRows(n - 1) = affine(patches(m, image), w.patchT, w.patchb);
  x += w.pos;
  for (int l = 0; l < m.depth; ++l) {
    const Block& b = w.blocks[static_cast<std::size_t>(l)];
    const bool here = o.layers.empty() || std::find(o.layers.begin(), o.layers.end(), l) != o.layers.end();
    const Variant& v = here && iv.family ? *iv.family : m.variant;
    const MatD h_in = layer_norm(x, b.n1w, b.n1b, m.layer_norm_eps);
    const MatD qkv = affine(h_in, b.qkvT, b.qkvb);
    MatD heads(n, dim);
    for (int h = 0; h < m.num_heads; ++h) {
      MatD q = qkv.middleCols(h * d, d);
      const MatD k = qkv.middleCols(dim + h * d, d), values = qkv.middleCols(2 * dim + h * d, d);
      if (here && !iv.transform.is_identity()) q = iv.transform.apply<double>(q);
      Mask mask;
      if (here && iv.mask) mask = build_mask(*iv.mask, m.grid, mask_seed(o.seed, image_id, l, h));
      heads.middleCols(h * d, d) = in_head(image_id, l, h, [&] {
        return attention_outputs<double>(v, q, k, values, m.scale, here && iv.mask ? &mask : nullptr);
      });
    }
    if (m.local_residual) {
      add_local_residual(m, m.blocks[static_cast<std::size_t>(l)], h_in, qkv.rightCols(dim), heads);
    }
    x += affine(heads, b.projT, b.projb);
    MatD hidden = affine(layer_norm(x, b.n2w, b.n2b, m.layer_norm_eps), b.fc1T, b.fc1b);
    hidden = hidden.unaryExpr([](double t) { return gelu(t); });
    x += affine(hidden, b.fc2T, b.fc2b);
    if (!x.allFinite()) {
      throw NumericalError("image " + std::to_string(image_id) + ", block " + std::to_string(l) + " of " + m.path +
                           ": expected finite activations, found NaN or Inf (weights too large for "
                           "this forward pass?)");
    }
  }
  const MatD cls = layer_norm(x.topRows(1), w.nw, w.nb, m.layer_norm_eps);
  VecD logits = affine(cls, w.headT, w.headb).transpose();
  // The logits are published as float: beyond float's range they would become Inf, and a NaN
  // would be predicted as class 0.
  const double float_max = std::numeric_limits<float>::max();
  if (!logits.allFinite() || logits.cwiseAbs().maxCoeff() > float_max) {
    throw NumericalError("image " + std::to_string(image_id) + ", the head of " + m.path +
                         ": expected finite logits within float's range, found NaN, Inf or |logit| > 3.4e38");
  }
  return logits;
}

}  // namespace

std::vector<Intervention> parse_interventions(std::string_view list, const VitModel& model, std::uint64_t seed) {
  std::vector<Intervention> out;
  for (const std::string_view spelled : split_list(list)) {
    const std::string item(spelled);
    Intervention iv;
    iv.name = item;
    if (item == "none") {
    } else if (item == "f1" || item == "f2" || item == "l2norm") {
      iv.transform = parse_query_transform(item, seed);
    } else if (item.rfind("family=", 0) == 0) {
      try {
        iv.family = parse_variant(item.substr(7), model.variant.convention, seed);
      } catch (const UsageError& e) {
        throw UsageError("--intervention '" + item + "': " + e.what());
      }
    } else if (item.rfind("local:", 0) == 0 || item.rfind("random:", 0) == 0) {
      iv.mask = parse_mask_specs(item).front();
    } else {
      throw UsageError("--intervention '" + item + "': expected none, local:K, random:N, f1, f2, l2norm or family=SPEC");
    }
    // Compared by what they run, not how they are spelled: local:03 is local:3, family=mala is
    // family=mala:elu1, family=softmax@code is family=softmax on a model of the code convention.
    const auto canonical = [](const Intervention& x) {
      if (x.mask) return x.mask->name();
      if (x.family) return "family=" + x.family->name();
      return x.name;
    };
    for (const Intervention& o : out) {
      if (canonical(o) == canonical(iv)) {
        throw UsageError("--intervention '" + item + "' is named twice: it repeats '" + o.name + "' (both are " +
                         canonical(iv) + ")");
      }
    }
    out.push_back(std::move(iv));
  }
  return out;
}

MatF replay_logits(const VitModel& m, const MatF& images, const std::vector<int>& image_ids,
                   const Intervention& iv, const ReplayOptions& o) {
  const Eigen::Index pixels = static_cast<Eigen::Index>(m.in_chans) * m.image_size * m.image_size;
  if (images.cols() != pixels) {
    throw UsageError("replay: the images have " + std::to_string(images.cols()) + " values each, the model " +
                     m.model_name + " takes " + std::to_string(m.in_chans) + " x " +
                     std::to_string(m.image_size) + " x " + std::to_string(m.image_size));
  }
  if (static_cast<Eigen::Index>(image_ids.size()) != images.rows()) throw UsageError("replay: one id per image");
  for (int l : o.layers) {
    if (l < 0 || l >= m.depth) {
      throw UsageError("--layers: the model has " + std::to_string(m.depth) + " blocks, found " + std::to_string(l));
    }
  }
  std::string why;
  const Variant& v = iv.family ? *iv.family : m.variant;
  if (!v.supports(&why)) throw UsageError(why);
  const Weights w = prepare(m);
  MatF logits(images.rows(), m.num_classes);
  parallel_for(static_cast<int>(images.rows()), [&](int i) {
    logits.row(i) = forward(m, w, images.row(i).data(), image_ids[static_cast<std::size_t>(i)], iv, o)
                        .cast<float>()
                        .transpose();
  });
  return logits;
}

}  // namespace attnscope::analyses
