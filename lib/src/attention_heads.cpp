// attention_heads.hpp: softmax_head_outputs is weight_blocks' score path and outputs_impl's
// product, kernel_head_outputs is linear_time_outputs (attention.cpp), each with its operands
// packed once per head, its row loops vectorised and several rows' sums interleaved.
#include "attnscope/attention_heads.hpp"

#include "attnscope/portable_math.hpp"
#include "kernel_rows.hpp"
#include "work_count.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace attnscope {
namespace {

// Loops across independent entries: the vector width changes the speed, never a value (see
// portable_math.cpp); on AVX-512 they ask for 512-bit vectors.
#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
#define ATTNSCOPE_WIDE_VECTORS __attribute__((target("prefer-vector-width=512")))
#else
#define ATTNSCOPE_WIDE_VECTORS
#endif

ATTNSCOPE_WIDE_VECTORS void scale_row(double* x, Eigen::Index n, double s) {
  for (Eigen::Index t = 0; t < n; ++t) x[t] *= s;
}

ATTNSCOPE_WIDE_VECTORS void divide_row(double* x, Eigen::Index n, double s) {
  for (Eigen::Index t = 0; t < n; ++t) x[t] /= s;
}

using Buffer = std::vector<double, Eigen::aligned_allocator<double>>;

struct HeadScratch {
  portable::PackedMatrix<double> keys_t, values, kv_packed;
  Buffer w, fq, fk, fk_t, kv, key_sum, value_sum, norm;
};

double* sized(Buffer& b, Eigen::Index count) {
  if (static_cast<Eigen::Index>(b.size()) < count) b.resize(static_cast<std::size_t>(count));
  return b.data();
}

HeadScratch& head_scratch() {
  thread_local HeadScratch s;
  return s;
}

/// Rows' sums in index order, G rows at a time: G independent chains of additions where one row
/// alone would wait on each addition. sum[r] = ((w_r0 + w_r1) + w_r2) + ..., Eigen's sum().
template <int G>
ATTNSCOPE_WIDE_VECTORS void row_sums(const double* w, Eigen::Index ldw, Eigen::Index n, double* sum) {
  double s[G];
  for (int r = 0; r < G; ++r) s[r] = w[r * ldw];
  for (Eigen::Index t = 1; t < n; ++t)
    for (int r = 0; r < G; ++r) s[r] += w[r * ldw + t];
  for (int r = 0; r < G; ++r) sum[r] = s[r];
}

}  // namespace

void softmax_head_outputs(const double* q, Eigen::Index ldq, Eigen::Index rows, const double* k, Eigen::Index ldk,
                          const double* v, Eigen::Index ldv, Eigen::Index n, Eigen::Index d, Eigen::Index dv,
                          double scale, const Mask* mask, double* out, Eigen::Index ldo,
                          std::vector<int>* degenerate) {
  if (n < 1 || (mask && (mask->rows() != rows || mask->cols() != n))) {
    throw std::logic_error("softmax_head_outputs: no keys, or a mask of another shape");
  }
  constexpr double kMinusInf = -std::numeric_limits<double>::infinity();
  HeadScratch& s = head_scratch();
  // W = q k^T: gemm_nt's order (each entry one chain of fused steps over the d dimensions).
  s.keys_t.pack(k, 1, ldk, d, n);
  double* w = sized(s.w, std::max<Eigen::Index>(rows * n, 1));
  detail::count_product(rows, d, n);
  portable::gemm_packed(q, ldq, s.keys_t, w, n, rows);
  // softmax_rows: scale, mask, max, exp(x - max), divide by the row's sum.
  constexpr int kGroup = 8;
  for (Eigen::Index i0 = 0; i0 < rows; i0 += kGroup) {
    const Eigen::Index g = std::min<Eigen::Index>(kGroup, rows - i0);
    bool empty[kGroup] = {};
    for (Eigen::Index r = 0; r < g; ++r) {
      double* row = w + (i0 + r) * n;
      scale_row(row, n, scale);
      if (mask) {
        for (Eigen::Index t = 0; t < n; ++t) row[t] = (*mask)(i0 + r, t) ? row[t] : kMinusInf;
      }
      const double top = portable::max_of(row, n);
      if (top == kMinusInf) {  // the mask keeps no key
        std::fill(row, row + n, 0.0);
        empty[r] = true;
        if (degenerate) degenerate->push_back(static_cast<int>(i0 + r));
        continue;
      }
      portable::exp_doubles(row, n, top);  // exp(-inf - top) = 0
    }
    double sum[kGroup];
    if (g == kGroup) {
      row_sums<kGroup>(w + i0 * n, n, n, sum);
    } else {
      for (Eigen::Index r = 0; r < g; ++r) row_sums<1>(w + (i0 + r) * n, n, n, sum + r);
    }
    for (Eigen::Index r = 0; r < g; ++r) {
      if (empty[r]) continue;
      divide_row(w + (i0 + r) * n, n, sum[r]);
    }
  }
  // out = W V: gemm_nn's order (each entry one chain of fused steps over the keys).
  s.values.pack(v, ldv, 1, n, dv);
  detail::count_product(rows, n, dv);
  portable::gemm_packed(w, n, s.values, out, ldo, rows);
}

namespace {

struct FloatHeadScratch {
  portable::PackedMatrix<float> keys_t, values;
  std::vector<float, Eigen::aligned_allocator<float>> q, k, v, w;
  std::vector<double, Eigen::aligned_allocator<double>> zeros, sums;
  std::vector<float> tops;
};

/// x (rows x cols, row stride ldx) rounded to float into `to` (row stride cols); false when a
/// value rounds to an infinite (or is not finite).
template <typename Alloc>
ATTNSCOPE_WIDE_VECTORS bool to_floats(const double* x, Eigen::Index ldx, Eigen::Index rows, Eigen::Index cols,
                                      std::vector<float, Alloc>& to) {
  if (static_cast<Eigen::Index>(to.size()) < rows * cols) to.resize(static_cast<std::size_t>(rows * cols));
  float* dst = to.data();
  // An OR over the exponent bits (all ones: infinite or NaN), which the compiler vectorises.
  std::uint32_t bad = 0;
  for (Eigen::Index i = 0; i < rows; ++i) {
    const double* src = x + i * ldx;
    float* row = dst + i * cols;
    for (Eigen::Index j = 0; j < cols; ++j) {
      const float f = static_cast<float>(src[j]);
      row[j] = f;
      std::uint32_t b;
      std::memcpy(&b, &f, sizeof b);
      bad |= static_cast<std::uint32_t>((b & 0x7f800000U) == 0x7f800000U);
    }
  }
  return bad == 0;
}

}  // namespace

bool softmax_head_outputs_float(const double* q, Eigen::Index ldq, Eigen::Index rows, const double* k,
                                Eigen::Index ldk, const double* v, Eigen::Index ldv, Eigen::Index n,
                                Eigen::Index d, Eigen::Index dv, double scale, double* out, Eigen::Index ldo) {
  if (n < 1) throw std::logic_error("softmax_head_outputs_float: no keys");
  thread_local FloatHeadScratch s;
  if (!to_floats(q, ldq, rows, d, s.q) || !to_floats(k, ldk, n, d, s.k) || !to_floats(v, ldv, n, dv, s.v)) {
    return false;
  }
  const float sf = static_cast<float>(scale);
  if (!std::isfinite(sf)) return false;
  s.keys_t.pack(s.k.data(), 1, d, d, n);
  if (static_cast<Eigen::Index>(s.w.size()) < rows * n) s.w.resize(static_cast<std::size_t>(rows * n));
  float* w = s.w.data();
  detail::count_product(rows, d, n);
  portable::gemm_packed(s.q.data(), d, s.keys_t, w, n, rows);
  // Each row's exponentials and their sum in one pass (exp_floats_sum's fixed order); the rows of
  // W V are divided by the sums afterwards: rows x dv divisions instead of rows x n.
  if (static_cast<Eigen::Index>(s.sums.size()) < rows) s.sums.resize(static_cast<std::size_t>(rows));
  if (static_cast<Eigen::Index>(s.tops.size()) < rows) s.tops.resize(static_cast<std::size_t>(rows));
  // A top that is not finite: a logit beyond float's range. Each sum >= 1 (exp(0) is a term).
  if (!portable::softmax_exps(w, n, rows, n, sf, s.tops.data(), s.sums.data())) return false;
  s.values.pack(s.v.data(), dv, 1, n, dv);
  if (static_cast<Eigen::Index>(s.zeros.size()) < dv) s.zeros.assign(static_cast<std::size_t>(dv), 0.0);
  detail::count_product(rows, n, dv);
  portable::gemm_packed_widen(w, n, s.values, s.zeros.data(), out, ldo, rows, false);
  for (Eigen::Index i = 0; i < rows; ++i) divide_row(out + i * ldo, dv, s.sums[static_cast<std::size_t>(i)]);
  return true;
}

namespace {

/// Column sums of x (n x c, row stride ldx) in index order, Eigen's colwise().sum(): the columns
/// side by side, each still ((x_0 + x_1) + x_2) + ...
ATTNSCOPE_WIDE_VECTORS void column_sums(const double* x, Eigen::Index ldx, Eigen::Index n, Eigen::Index c, double* sum) {
  for (Eigen::Index j = 0; j < c; ++j) sum[j] = x[j];
  for (Eigen::Index t = 1; t < n; ++t)
    for (Eigen::Index j = 0; j < c; ++j) sum[j] += x[t * ldx + j];
}

/// dot(f_i, s) and |f_i|^2 of G rows of f (row stride ldf, r wide), each one sum in index order
/// as Eigen's dot() and squaredNorm(), the G rows' chains interleaved.
template <int G>
void dots_and_norms(const double* f, Eigen::Index ldf, Eigen::Index r, const double* s, double* dot, double* sq) {
  double a[G], b[G];
  for (int g = 0; g < G; ++g) {
    a[g] = f[g * ldf] * s[0];
    b[g] = f[g * ldf] * f[g * ldf];
  }
  for (Eigen::Index t = 1; t < r; ++t)
    for (int g = 0; g < G; ++g) {
      const double x = f[g * ldf + t];
      a[g] += x * s[t];
      b[g] += x * x;
    }
  for (int g = 0; g < G; ++g) dot[g] = a[g], sq[g] = b[g];
}

}  // namespace

bool query_features_row_local(const Variant& v) {
  return !(v.uses_map() && v.map.kind == MapKind::ReluAffine);
}

void kernel_head_outputs(const Variant& v, const double* q, Eigen::Index ldq, Eigen::Index rows, const double* k,
                         Eigen::Index ldk, const double* values, Eigen::Index ldv, Eigen::Index n, Eigen::Index d,
                         Eigen::Index dv, double scale, double* out, Eigen::Index ldo) {
  const KernelFamily* family = v.kernel();
  if (family == nullptr || n < 1) throw std::logic_error("kernel_head_outputs: no kernel form, or no keys");
  if (family->separate_normaliser(v) || v.needs_params()) {
    throw UsageError(v.name() + ": the fast heads take families computed from q and k alone, with S_i from "
                     "their own features; attention_outputs computes this one");
  }
  using Strided = Eigen::Map<const MatD, 0, Eigen::OuterStride<>>;
  const Strided qm(q, rows, d, Eigen::OuterStride<>(ldq)), km(k, n, d, Eigen::OuterStride<>(ldk));
  HeadScratch& s = head_scratch();
  const Eigen::Index r = family->feature_dim(v, static_cast<int>(d));
  Eigen::Map<MatD> fq(sized(s.fq, std::max<Eigen::Index>(rows * r, 1)), rows, r);
  Eigen::Map<MatD> fk(sized(s.fk, n * r), n, r);
  family->query_features(v, qm, TokenPositions{}, n, scale, fq);
  family->key_features(v, qm, km, scale, fk);
  // Not finite: the library's own check names the row (and throws).
  if (!portable::all_finite(fq.data(), rows * r)) detail::query_features_into(v, qm, TokenPositions{}, n, scale, fq);
  if (!portable::all_finite(fk.data(), n * r)) detail::key_features_into(v, qm, km, scale, fk);
  // kv = F_k^T V: gemm_nn's order over the keys; F_k^T laid out row-major first.
  double* fk_t = sized(s.fk_t, r * n);
  for (Eigen::Index t = 0; t < n; ++t)
    for (Eigen::Index j = 0; j < r; ++j) fk_t[j * n + t] = fk(t, j);
  s.values.pack(values, ldv, 1, n, dv);
  double* kv = sized(s.kv, r * dv);
  detail::count_product(r, n, dv);
  portable::gemm_packed(fk_t, n, s.values, kv, dv, r);
  double* key_sum = sized(s.key_sum, r);
  double* value_sum = sized(s.value_sum, dv);
  column_sums(fk.data(), r, n, r, key_sum);
  column_sums(values, ldv, n, dv, value_sum);
  double key_sq = key_sum[0] * key_sum[0];
  for (Eigen::Index j = 1; j < r; ++j) key_sq += key_sum[j] * key_sum[j];
  const double key_sum_norm = std::sqrt(key_sq);
  // o = F_q kv, then each row's RowForm: o_i = a_i o_i + b_i sum_j v_j.
  s.kv_packed.pack(kv, dv, 1, r, dv);
  detail::count_product(rows, r, dv);
  portable::gemm_packed(fq.data(), r, s.kv_packed, out, ldo, rows);
  double* dots = sized(s.norm, 2 * std::max<Eigen::Index>(rows, 1));
  double* sqs = dots + rows;
  constexpr int G = 8;
  Eigen::Index i = 0;
  for (; i + G <= rows; i += G) dots_and_norms<G>(fq.data() + i * r, r, r, key_sum, dots + i, sqs + i);
  for (; i < rows; ++i) dots_and_norms<1>(fq.data() + i * r, r, r, key_sum, dots + i, sqs + i);
  for (i = 0; i < rows; ++i) {
    const RowForm rn = kernel_row_form(v, dots[i], static_cast<int>(n), std::sqrt(sqs[i]) * key_sum_norm);
    double* o = out + i * ldo;
    if (rn.degenerate) {
      std::fill(o, o + dv, 0.0);
      continue;
    }
    for (Eigen::Index j = 0; j < dv; ++j) o[j] = rn.a * o[j] + rn.b * value_sum[j];
  }
  for (i = 0; i < rows; ++i) {
    if (!portable::all_finite(out + i * ldo, dv)) {
      throw NumericalError(v.name() + ": attention outputs overflow double (inputs too large in magnitude)");
    }
  }
}

}  // namespace attnscope
