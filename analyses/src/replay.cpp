// The C++ ViT forward pass with interventions (replay.hpp).
#include "attnscope/analyses/replay.hpp"

#include "attnscope/analyses/head_error.hpp"
#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"
#include "attnscope/parallel.hpp"
#include "attnscope/portable_math.hpp"
#include "attnscope/attention_heads.hpp"
#include "attnscope/text.hpp"

#include <algorithm>
#include <limits>
#include <cmath>

namespace attnscope::analyses {

/// The model's tensors, prepared once per run: the dense layers' matrices transposed (rows in,
/// columns out) in float, as the exporting framework multiplies them, and packed for
/// portable::gemm_packed (the fast pass; the q and the k, v columns of qkv apart, so that a block
/// can compute its queries for some rows only); vectors in double.
struct ReplayBlockWeights {
  VecD n1w, n1b, qkvb, projb, n2w, n2b, fc1b, fc2b;
  VecD q_bias, kv_bias;  ///< qkvb's first D and last 2D entries
  MatF qkvT, projT, fc1T, fc2T;
  portable::PackedMatrix<float> qkv, q, kv, proj, fc1, fc2;
};
struct ReplayModel::Weights {
  MatF patchT;  ///< (C P P) x D
  VecD patchb, cls;
  MatD pos;
  std::vector<ReplayBlockWeights> blocks;
  VecD nw, nb, headb;
  MatF headT;
  portable::PackedMatrix<float> patch, head;
};

namespace {

using Weights = ReplayModel::Weights;
using Block = ReplayBlockWeights;

/// wT (k x n, row-major) packed, columns [c0, c0 + n).
portable::PackedMatrix<float> packed(const MatF& wT, Eigen::Index c0, Eigen::Index n) {
  portable::PackedMatrix<float> p;
  p.pack(wT.data() + c0, wT.cols(), 1, wT.rows(), n);
  return p;
}

std::unique_ptr<const Weights> prepare(const VitModel& m) {
  auto w = std::make_unique<Weights>();
  w->patchT = m.patch_w.transpose();
  w->patchb = m.patch_b.cast<double>();
  w->cls = m.cls_token.cast<double>();
  w->pos = m.pos_embed.cast<double>();
  for (const VitBlock& b : m.blocks) {
    Block o;
    o.n1w = b.norm1_w.cast<double>(), o.n1b = b.norm1_b.cast<double>();
    o.qkvT = b.qkv_w.transpose(), o.qkvb = b.qkv_b.cast<double>();
    o.projT = b.proj_w.transpose(), o.projb = b.proj_b.cast<double>();
    o.n2w = b.norm2_w.cast<double>(), o.n2b = b.norm2_b.cast<double>();
    o.fc1T = b.fc1_w.transpose(), o.fc1b = b.fc1_b.cast<double>();
    o.fc2T = b.fc2_w.transpose(), o.fc2b = b.fc2_b.cast<double>();
    const Eigen::Index dim = o.qkvT.rows();
    o.qkv = packed(o.qkvT, 0, o.qkvT.cols());
    o.q = packed(o.qkvT, 0, dim);
    o.kv = packed(o.qkvT, dim, o.qkvT.cols() - dim);
    o.q_bias = o.qkvb.head(dim), o.kv_bias = o.qkvb.tail(o.qkvb.size() - dim);
    o.proj = packed(o.projT, 0, o.projT.cols());
    o.fc1 = packed(o.fc1T, 0, o.fc1T.cols());
    o.fc2 = packed(o.fc2T, 0, o.fc2T.cols());
    w->blocks.push_back(std::move(o));
  }
  w->nw = m.norm_w.cast<double>(), w->nb = m.norm_b.cast<double>();
  w->headT = m.head_w.transpose(), w->headb = m.head_b.cast<double>();
  w->patch = packed(w->patchT, 0, w->patchT.cols());
  w->head = packed(w->headT, 0, w->headT.cols());
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
  MatF yf(x.rows(), wT.cols());
  portable::product(xf, wT, yf);  // a fixed order: the same bits on every CPU and build
  MatD y = yf.cast<double>();
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

/// The exact GELU, erf being portable::erf (glibc's erf rounds a few arguments differently on a
/// CPU without FMA): the same bits on every CPU.
double gelu(double t) { return 0.5 * t * (1.0 + portable::erf(t * M_SQRT1_2)); }

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
/// The local residual's 3 x 3 kernels, channel c's at 9c..9c+8, from the attention input h.
VecD local_residual_kernels(const VitModel& m, const VitBlock& b, ConstRef<double> h) {
  const VecD mean = h.colwise().mean().transpose();
  VecD hidden = grouped(b.lr_conv1_w, b.lr_conv1_b, mean, m.num_heads);
  for (Eigen::Index i = 0; i < hidden.size(); ++i) hidden(i) = gelu(hidden(i));
  return grouped(b.lr_conv2_w, b.lr_conv2_b, hidden, m.num_heads);
}

void add_local_residual(const VitModel& m, const VitBlock& b, ConstRef<double> h, ConstRef<double> v, MatD& heads) {
  const VecD kernels = local_residual_kernels(m, b, h);  // channel c: 9c..9c+8
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

/// The logits are published as float: beyond float's range they would become Inf, and a NaN
/// would be predicted as class 0.
void check_logits(const VitModel& m, int image_id, const VecD& logits) {
  const double float_max = std::numeric_limits<float>::max();
  if (!logits.allFinite() || logits.cwiseAbs().maxCoeff() > float_max) {
    throw NumericalError("image " + std::to_string(image_id) + ", the head of " + m.path +
                         ": expected finite logits within float's range, found NaN, Inf or |logit| > 3.4e38");
  }
}

/// The plain forward pass: Eigen matrices, every token of every block, the library's attention
/// head by head (ReplayOptions::reference; the fast pass below must give its logits bit for bit).
VecD forward_reference(const VitModel& m, const Weights& w, const float* image, int image_id, const Intervention& iv,
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
  check_logits(m, image_id, logits);
  return logits;
}

// ---- The fast forward pass: the reference's operations, in its order, on packed weights ----

/// One thread's buffers, grown to the largest model seen and then reused image after image.
struct Workspace {
  MatD x, h, qkv, heads, q_mapped;
  MatF in, out;  ///< the dense layers' float operand and product
  Mask mask_rows;
};

Workspace& thread_workspace() {
  thread_local Workspace ws;
  return ws;
}

/// Resizes without touching the contents (Eigen reallocates only when the size changes).
template <typename M>
void ensure(M& m, Eigen::Index rows, Eigen::Index cols) {
  if (m.rows() != rows || m.cols() != cols) m.resize(rows, cols);
}

/// layer_norm's rows [0, rows) of x into y (double; null: not written) and yf (float(y); null: not
/// written): the mean and the variance each one sum in index order (Eigen's mean()), G rows'
/// sums interleaved so that they do not wait on each other.
template <int G>
void layer_norm_group(const double* x, Eigen::Index ldx, Eigen::Index dim, const VecD& w, const VecD& b, double eps,
                      double* y, Eigen::Index ldy, float* yf, Eigen::Index ldf) {
  const auto n = static_cast<double>(dim);
  double sum[G], mean[G], sq[G], sd[G];
  for (int r = 0; r < G; ++r) sum[r] = x[r * ldx];
  for (Eigen::Index c = 1; c < dim; ++c)
    for (int r = 0; r < G; ++r) sum[r] += x[r * ldx + c];
  for (int r = 0; r < G; ++r) {
    mean[r] = sum[r] / n;
    const double t = x[r * ldx] - mean[r];
    sq[r] = t * t;
  }
  for (Eigen::Index c = 1; c < dim; ++c)
    for (int r = 0; r < G; ++r) {
      const double t = x[r * ldx + c] - mean[r];
      sq[r] += t * t;
    }
  for (int r = 0; r < G; ++r) sd[r] = std::sqrt(sq[r] / n + eps);
  const double* wp = w.data();
  const double* bp = b.data();
  for (int r = 0; r < G; ++r) {
    const double* xr = x + r * ldx;
    for (Eigen::Index c = 0; c < dim; ++c) {
      const double v = ((xr[c] - mean[r]) / sd[r]) * wp[c] + bp[c];
      if (y) y[r * ldy + c] = v;
      if (yf) yf[r * ldf + c] = static_cast<float>(v);
    }
  }
}

/// layer_norm of rows [0, rows) of x: into y (when given) and, as float, into ws.in (the next
/// dense layer's operand).
void layer_norm_rows(const MatD& x, Eigen::Index rows, const VecD& w, const VecD& b, double eps, MatD* y,
                     Workspace& ws) {
  constexpr int G = 8;
  const Eigen::Index dim = x.cols();
  ensure(ws.in, std::max(ws.in.rows(), rows), std::max(ws.in.cols(), dim));
  const Eigen::Index ldf = ws.in.cols();
  const auto out = [&](Eigen::Index i) { return y ? y->row(i).data() : nullptr; };
  Eigen::Index i = 0;
  for (; i + G <= rows; i += G) {
    layer_norm_group<G>(x.row(i).data(), dim, dim, w, b, eps, out(i), dim, ws.in.data() + i * ldf, ldf);
  }
  for (; i < rows; ++i) layer_norm_group<1>(x.row(i).data(), dim, dim, w, b, eps, out(i), dim, ws.in.data() + i * ldf, ldf);
}

/// float(x) for rows [0, rows), columns [0, k) of x: the dense layers' operand, into ws.in.
void to_float(const double* x, Eigen::Index ldx, Eigen::Index rows, Eigen::Index k, Workspace& ws) {
  ensure(ws.in, std::max(ws.in.rows(), rows), std::max(ws.in.cols(), k));
  const Eigen::Index ldi = ws.in.cols();
  float* in = ws.in.data();
  for (Eigen::Index i = 0; i < rows; ++i)
    for (Eigen::Index t = 0; t < k; ++t) in[i * ldi + t] = static_cast<float>(x[i * ldx + t]);
}

/// The product of ws.in's rows [0, rows) and the packed weights, into ws.out (rows x n floats).
void product(Eigen::Index rows, const portable::PackedMatrix<float>& w, Workspace& ws) {
  ensure(ws.out, std::max(ws.out.rows(), rows), std::max(ws.out.cols(), w.cols()));
  portable::gemm_packed(ws.in.data(), ws.in.cols(), w, ws.out.data(), ws.out.cols(), rows);
}

/// y = affine's x W^T + b for rows [0, rows), x already in ws.in: y[i, j] = double(product) + b[j].
void dense(Eigen::Index rows, const portable::PackedMatrix<float>& w, const VecD& b, double* y, Eigen::Index ldy,
           Workspace& ws) {
  portable::gemm_packed_widen(ws.in.data(), ws.in.cols(), w, b.data(), y, ldy, rows, false);
}

/// x += affine(...) for rows [0, rows), the input already in ws.in: x[i, j] + (double(product) + b[j]).
void dense_add(Eigen::Index rows, const portable::PackedMatrix<float>& w, const VecD& b, double* x, Eigen::Index ldx,
               Workspace& ws) {
  portable::gemm_packed_widen(ws.in.data(), ws.in.cols(), w, b.data(), x, ldx, rows, true);
}

/// fc1 and the GELU for rows [0, rows), the input in ws.in: float(gelu(double(product) + b))
/// into ws.in, fc2's operand; the same bits as affine() then gelu() value by value, the erf of a
/// chunk at a time through portable::erfs, without a double hidden matrix.
void dense_gelu(Eigen::Index rows, const portable::PackedMatrix<float>& w, const VecD& b, Workspace& ws) {
  product(rows, w, ws);
  const Eigen::Index cols = w.cols(), ldo = ws.out.cols();
  ensure(ws.in, std::max(ws.in.rows(), rows), std::max(ws.in.cols(), cols));
  const Eigen::Index ldi = ws.in.cols();
  constexpr Eigen::Index kChunk = 256;
  alignas(64) double h[kChunk], u[kChunk], e[kChunk];
  const double* bias = b.data();
  for (Eigen::Index i = 0; i < rows; ++i) {
    const float* row = ws.out.data() + i * ldo;
    float* in = ws.in.data() + i * ldi;
    for (Eigen::Index c0 = 0; c0 < cols; c0 += kChunk) {
      const Eigen::Index len = std::min(kChunk, cols - c0);
      for (Eigen::Index t = 0; t < len; ++t) {
        h[t] = static_cast<double>(row[c0 + t]) + bias[c0 + t];
        u[t] = h[t] * M_SQRT1_2;
      }
      portable::erfs(u, e, len);
      for (Eigen::Index t = 0; t < len; ++t) in[c0 + t] = static_cast<float>(0.5 * h[t] * (1.0 + e[t]));
    }
  }
}

/// Every value of the rows x cols block at p (row stride ld) finite.
bool block_finite(const double* p, Eigen::Index rows, Eigen::Index cols, Eigen::Index ld) {
  if (ld == cols) return portable::all_finite(p, rows * cols);
  bool ok = true;
  for (Eigen::Index i = 0; i < rows; ++i) ok = portable::all_finite(p + i * ld, cols) && ok;
  return ok;
}

/// add_local_residual's filter with every channel of a token at once (the channels are
/// contiguous): each output is still 0 + the in-range taps in (i, j) order, then added to heads.
void add_local_residual_fast(const VitModel& m, const VitBlock& b, const MatD& h, const MatD& qkv, MatD& heads) {
  const VecD kernels = local_residual_kernels(m, b, h);
  const int g = m.grid.height, p = m.grid.prefix, dim = m.embed_dim;
  Eigen::Matrix<double, 9, Eigen::Dynamic, Eigen::RowMajor> taps(9, dim);  // tap-major
  for (int ch = 0; ch < dim; ++ch)
    for (int t = 0; t < 9; ++t) taps(t, ch) = kernels(9 * ch + t);
  VecD s(dim);
  for (int r = 0; r < g; ++r) {
    for (int c = 0; c < g; ++c) {
      s.setZero();
      for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j) {
          const int rr = r + i - 1, cc = c + j - 1;
          if (rr < 0 || rr >= g || cc < 0 || cc >= g) continue;
          const double* k = taps.row(3 * i + j).data();
          const double* v = qkv.row(p + rr * g + cc).data() + 2 * dim;
          for (int ch = 0; ch < dim; ++ch) s(ch) += k[ch] * v[ch];
        }
      }
      double* out = heads.row(p + r * g + c).data();
      for (int ch = 0; ch < dim; ++ch) out[ch] += s(ch);
    }
  }
}

using StridedConst = Eigen::Map<const MatD, 0, Eigen::OuterStride<>>;

/// forward_reference's logits, bit for bit, computed faster: packed products with the bias, the
/// widening and the residual add in their epilogue, per-thread buffers, the softmax and unmasked
/// kernel-form heads through attention_heads.hpp, the GELU's erf vectorised, and the last block
/// for the CLS row only (its queries, attention output, projection and MLP; keys and values of
/// every token). A row's values in the reference depend on that row alone in every step but the
/// attention's keys and values, so skipping the other rows changes nothing; the steps that are
/// not row by row in the library (a query map's product, a mask's kept sums on a kernel family,
/// relu_affine's features) still run on every row and the CLS row is taken from them.
VecD forward_fast(const VitModel& m, const Weights& w, const float* image, int image_id, const Intervention& iv,
                  const ReplayOptions& o) {
  const int n = m.grid.tokens(), dim = m.embed_dim, d = m.head_dim;
  Workspace& ws = thread_workspace();
  ensure(ws.x, n, dim);
  ensure(ws.h, n, dim);
  ensure(ws.qkv, n, 3 * dim);
  ensure(ws.heads, n, dim);
  MatD& x = ws.x;
  // Patch embedding: the reference's patches() and affine(), in float from the start (the image
  // is float: the same values).
  {
    const int g = m.grid.height, p = m.patch_size, c = m.in_chans, s = m.image_size, cpp = c * p * p;
    ensure(ws.in, std::max<Eigen::Index>(ws.in.rows(), g * g), std::max<Eigen::Index>(ws.in.cols(), cpp));
    const Eigen::Index ldi = ws.in.cols();
    for (int py = 0; py < g; ++py)
      for (int px = 0; px < g; ++px)
        for (int ch = 0; ch < c; ++ch)
          for (int y = 0; y < p; ++y)
            for (int xx = 0; xx < p; ++xx)
              ws.in((py * g + px), (ch * p + y) * p + xx) =
                  image[(static_cast<std::ptrdiff_t>(ch) * s + py * p + y) * s + px * p + xx];
    ensure(ws.out, std::max<Eigen::Index>(ws.out.rows(), g * g), std::max<Eigen::Index>(ws.out.cols(), dim));
    portable::gemm_packed(ws.in.data(), ldi, w.patch, ws.out.data(), ws.out.cols(), g * g);
    const Eigen::Index ldo = ws.out.cols();
    for (int j = 0; j < dim; ++j) x(0, j) = w.cls(j) + w.pos(0, j);
    for (int i = 0; i < g * g; ++i)
      for (int j = 0; j < dim; ++j) {
        x(1 + i, j) = (static_cast<double>(ws.out.data()[i * ldo + j]) + w.patchb(j)) + w.pos(1 + i, j);
      }
  }
  for (int l = 0; l < m.depth; ++l) {
    const Block& b = w.blocks[static_cast<std::size_t>(l)];
    const bool here = o.layers.empty() || std::find(o.layers.begin(), o.layers.end(), l) != o.layers.end();
    const Variant& v = here && iv.family ? *iv.family : m.variant;
    const bool last = l + 1 == m.depth;
    const Eigen::Index rows = last ? 1 : n;  // the rows this block's output is needed for
    layer_norm_rows(x, n, b.n1w, b.n1b, m.layer_norm_eps, m.local_residual ? &ws.h : nullptr, ws);
    // q for the rows needed (for every row where a query map, a mask on a kernel family or
    // relu_affine's features run: none of them is computed row by row), k and v for every token.
    const bool mapped = here && !iv.transform.is_identity();
    const bool masked = here && iv.mask.has_value();
    const bool all_queries =
        mapped || (masked && v.form() == Form::Kernel) || !query_features_row_local(v);
    if (all_queries || rows == n) {
      dense(n, b.qkv, b.qkvb, ws.qkv.data(), 3 * dim, ws);
    } else {
      dense(rows, b.q, b.q_bias, ws.qkv.data(), 3 * dim, ws);
      dense(n, b.kv, b.kv_bias, ws.qkv.data() + dim, 3 * dim, ws);
    }
    for (int h = 0; h < m.num_heads; ++h) {
      const double* q = ws.qkv.data() + h * d;
      Eigen::Index ldq = 3 * dim;
      if (mapped) {
        ws.q_mapped = iv.transform.apply<double>(ws.qkv.middleCols(h * d, d));
        q = ws.q_mapped.data(), ldq = d;
      }
      const double* k = ws.qkv.data() + dim + h * d;
      const double* values = ws.qkv.data() + 2 * dim + h * d;
      Mask mask;
      if (masked) mask = build_mask(*iv.mask, m.grid, mask_seed(o.seed, image_id, l, h));
      in_head(image_id, l, h, [&] {
        if (const ScoreFamily* scores = v.score()) {
          const Mask* kept = nullptr;
          if (masked && rows == n) {
            kept = &mask;
          } else if (masked) {
            ws.mask_rows = mask.topRows(rows);
            kept = &ws.mask_rows;
          }
          const bool in_float = o.float_attention && kept == nullptr &&
                                scores->head_outputs_float(q, ldq, rows, k, 3 * dim, values, 3 * dim, n, d, d,
                                                           m.scale, ws.heads.data() + h * d, dim);
          if (!in_float) {
            scores->head_outputs(q, ldq, rows, k, 3 * dim, values, 3 * dim, n, d, d, m.scale, kept,
                                 ws.heads.data() + h * d, dim, nullptr);
          }
          if (!block_finite(ws.heads.data() + h * d, rows, d, dim)) {
            throw NumericalError(v.name() + ": attention outputs overflow double (inputs too large in magnitude)");
          }
        } else if (!masked) {
          kernel_head_outputs(v, q, ldq, all_queries ? n : rows, k, 3 * dim, values, 3 * dim, n, d, d, m.scale,
                              ws.heads.data() + h * d, dim);
        } else {
          const MatD out = attention_outputs<double>(v, StridedConst(q, n, d, Eigen::OuterStride<>(ldq)),
                                                     StridedConst(k, n, d, Eigen::OuterStride<>(3 * dim)),
                                                     StridedConst(values, n, d, Eigen::OuterStride<>(3 * dim)),
                                                     m.scale, &mask);
          ws.heads.block(0, h * d, rows, d) = out.topRows(rows);
        }
      });
    }
    if (m.local_residual && rows > m.grid.prefix) {
      add_local_residual_fast(m, m.blocks[static_cast<std::size_t>(l)], ws.h, ws.qkv, ws.heads);
    }
    to_float(ws.heads.data(), dim, rows, dim, ws);
    dense_add(rows, b.proj, b.projb, x.data(), dim, ws);
    layer_norm_rows(x, rows, b.n2w, b.n2b, m.layer_norm_eps, nullptr, ws);
    dense_gelu(rows, b.fc1, b.fc1b, ws);
    dense_add(rows, b.fc2, b.fc2b, x.data(), dim, ws);
    if (!block_finite(x.data(), rows, dim, dim)) {
      throw NumericalError("image " + std::to_string(image_id) + ", block " + std::to_string(l) + " of " + m.path +
                           ": expected finite activations, found NaN or Inf (weights too large for "
                           "this forward pass?)");
    }
  }
  layer_norm_rows(x, 1, w.nw, w.nb, m.layer_norm_eps, nullptr, ws);
  VecD logits(m.num_classes);
  dense(1, w.head, w.headb, logits.data(), m.num_classes, ws);
  check_logits(m, image_id, logits);
  return logits;
}

}  // namespace

ReplayModel::ReplayModel(const VitModel& model) : model_(&model), weights_(prepare(model)) {}
ReplayModel::~ReplayModel() = default;
ReplayModel::ReplayModel(ReplayModel&&) noexcept = default;
ReplayModel& ReplayModel::operator=(ReplayModel&&) noexcept = default;

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
      iv.mask = parse_mask_specs(item, "--intervention").front();
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

MatF replay_logits(const ReplayModel& model, const MatF& images, const std::vector<int>& image_ids,
                   const Intervention& iv, const ReplayOptions& o) {
  const VitModel& m = model.model();
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
  const Weights& w = model.weights();
  MatF logits(images.rows(), m.num_classes);
  parallel_for(static_cast<int>(images.rows()), [&](int i) {
    const float* image = images.row(i).data();
    const int id = image_ids[static_cast<std::size_t>(i)];
    const VecD l = o.reference ? forward_reference(m, w, image, id, iv, o) : forward_fast(m, w, image, id, iv, o);
    logits.row(i) = l.cast<float>().transpose();
  });
  return logits;
}

MatF replay_logits(const VitModel& m, const MatF& images, const std::vector<int>& image_ids, const Intervention& iv,
                   const ReplayOptions& o) {
  return replay_logits(ReplayModel(m), images, image_ids, iv, o);
}

}  // namespace attnscope::analyses
