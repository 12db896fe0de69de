// Explicit weights and outputs of every family (attention.hpp): the kernel form generically, the
// score form through the family's ScoreFamily (family.hpp). Nothing here names a family.
#include "attnscope/attention.hpp"

#include "attnscope/portable_math.hpp"
#include "kernel_rows.hpp"
#include "work_count.hpp"

#include <algorithm>
#include <array>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

namespace attnscope {
namespace detail {

void check_inputs(const Variant& v, Eigen::Index q_rows, Eigen::Index q_cols, Eigen::Index k_rows,
                  Eigen::Index k_cols, const Mask* mask) {
  std::string why;
  if (!v.supports(&why)) throw UsageError(why);
  const auto str = [](Eigen::Index x) { return std::to_string(x); };
  if (k_rows < 1) throw UsageError(v.name() + ": no keys");
  if (q_cols != k_cols) {
    throw UsageError(v.name() + ": query width " + str(q_cols) + " differs from key width " +
                     str(k_cols));
  }
  if (mask && (mask->rows() != q_rows || mask->cols() != k_rows)) {
    throw UsageError(v.name() + ": mask is " + str(mask->rows()) + " x " + str(mask->cols()) +
                     ", expected " + str(q_rows) + " x " + str(k_rows));
  }
}

namespace {

const KernelFamily& kernel_of(const Variant& v) {
  const KernelFamily* f = v.kernel();
  if (!f) throw UsageError(v.name() + ": " + std::string(v.family->name()) + " has no kernel form");
  return *f;
}

void require_finite_features(ConstRef<double> f, const Variant& v, const char* what) {
  if (f.allFinite()) return;
  for (Eigen::Index i = 0; i < f.rows(); ++i) {
    if (!f.row(i).allFinite()) {
      throw NumericalError(v.name() + ": " + what + " features of row " + std::to_string(i) +
                           " are not finite (overflow or non-finite input)");
    }
  }
}

}  // namespace

void key_features_into(const Variant& v, ConstRef<double> q, ConstRef<double> k, double scale,
                       Eigen::Ref<MatD> out) {
  kernel_of(v).key_features(v, q, k, scale, out);
  require_finite_features(out, v, "key");
}

void normaliser_features_into(const Variant& v, ConstRef<double> q, ConstRef<double> k, double scale,
                              Eigen::Ref<MatD> gq, Eigen::Ref<MatD> gk) {
  const KernelFamily& f = kernel_of(v);
  f.normaliser_query_features(v, q, TokenPositions{}, k.rows(), scale, gq);
  require_finite_features(gq, v, "query normaliser");
  f.normaliser_key_features(v, q, k, scale, gk);
  require_finite_features(gk, v, "key normaliser");
}

void query_features_into(const Variant& v, ConstRef<double> q, TokenPositions positions,
                         Eigen::Index n_keys, double scale, Eigen::Ref<MatD> out) {
  kernel_of(v).query_features(v, q, positions, n_keys, scale, out);
  require_finite_features(out, v, "query");
}

}  // namespace detail

KernelFeatures kernel_features(const Variant& v, ConstRef<double> q, ConstRef<double> k, double scale) {
  const KernelFamily& family = detail::kernel_of(v);
  const int r = family.feature_dim(v, static_cast<int>(q.cols()));
  KernelFeatures f{MatD(q.rows(), r), MatD(k.rows(), r), MatD(), MatD(), false};
  detail::query_features_into(v, q, TokenPositions{}, k.rows(), scale, f.q);
  detail::key_features_into(v, q, k, scale, f.k);
  if (family.separate_normaliser(v)) {
    const int g = family.normaliser_dim(v, static_cast<int>(q.cols()));
    f.gq.resize(q.rows(), g);
    f.gk.resize(k.rows(), g);
    f.separate = true;
    detail::normaliser_features_into(v, q, k, scale, f.gq, f.gk);
  }
  return f;
}

MatD normaliser_query_features(const Variant& v, ConstRef<double> q, TokenPositions positions,
                               Eigen::Index n_keys, double scale) {
  const KernelFamily& family = detail::kernel_of(v);
  if (!family.separate_normaliser(v)) return query_features(v, q, positions, n_keys, scale);
  MatD out(q.rows(), family.normaliser_dim(v, static_cast<int>(q.cols())));
  family.normaliser_query_features(v, q, positions, n_keys, scale, out);
  detail::require_finite_features(out, v, "query normaliser");
  return out;
}

MatD query_features(const Variant& v, ConstRef<double> q, TokenPositions positions,
                    Eigen::Index n_keys, double scale) {
  MatD out(q.rows(), detail::kernel_of(v).feature_dim(v, static_cast<int>(q.cols())));
  detail::query_features_into(v, q, positions, n_keys, scale, out);
  return out;
}

RowForm kernel_row_form(const Variant& v, double S, int n_kept, double magnitude) {
  const KernelFamily& family = detail::kernel_of(v);
  if (n_kept == 0) return {};
  if (!std::isfinite(S) || !std::isfinite(magnitude)) {
    throw NumericalError(v.name() + ": f(q).sum f(k) or its scale |f(q)| |sum f(k)| overflows double");
  }
  return family.variant_row_form(v, S, n_kept, magnitude);
}

namespace {

using RowBlock = Eigen::Ref<MatD>;

/// Rows of W are computed this many at a time: the block stays in cache and no N x N double
/// matrix is ever allocated (outputs through weights never hold W at all).
constexpr Eigen::Index kRowBlock = 32;

/// Turns rows r0.. of P = F_q F_k^T into weights by each row's RowForm, from S_i = g_q(i).sum g_k
/// (fq and fk themselves but for a family with normaliser features of its own). `key_sum` is
/// sum_m g_k(m) over all keys (used without a mask).
void kernel_rows(const Variant& v, const MatD& fq, const MatD& fk, const VecD& key_sum, RowBlock w,
                 Eigen::Index r0, const Mask* mask, std::vector<int>& degenerate) {
  MatD kept_sums;  // row i: sum of g_k(m) over the keys kept by query r0 + i
  if (mask) kept_sums.noalias() = mask->middleRows(r0, w.rows()).cast<double>().matrix() * fk;
  const double key_sum_norm = key_sum.norm();
  for (Eigen::Index i = 0; i < w.rows(); ++i) {
    const auto q = fq.row(r0 + i);
    const RowForm rn =
        mask ? kernel_row_form(v, q.dot(kept_sums.row(i)), static_cast<int>(mask->row(r0 + i).count()),
                               q.norm() * kept_sums.row(i).norm())
             : kernel_row_form(v, q.dot(key_sum.transpose()), static_cast<int>(fk.rows()),
                               q.norm() * key_sum_norm);
    auto row = w.row(i).array();
    if (rn.degenerate) {
      row.setZero();
      degenerate.push_back(static_cast<int>(r0 + i));
    } else if (mask) {
      row = mask->row(r0 + i).select(rn.a * row + rn.b, 0.0);
    } else {
      row = rn.a * row + rn.b;
    }
  }
}

/// Weights and outputs that do not fit T (products of features past 1e154 in double, InLine or
/// MALA weights past 3.4e38 in float) are refused, never returned as NaN or Inf.
template <typename Derived>
void require_finite(const Eigen::DenseBase<Derived>& x, const Variant& v, const char* what) {
  if (!x.allFinite()) {
    throw NumericalError(v.name() + ": " + what + " overflow double (inputs too large in magnitude)");
  }
}

void publish(Diagnostics* diag, std::vector<int>&& degenerate) {
  if (diag) diag->degenerate_rows = std::move(degenerate);  // rows are visited in order: sorted
}

/// Computes W block of rows by block and hands each (first row, block) to `sink`.
template <typename Sink>
void weight_blocks(const Variant& v, ConstRef<double> q, ConstRef<double> k, double scale,
                   const Mask* mask, Diagnostics* diag, Sink sink) {
  detail::check_inputs(v, q.rows(), q.cols(), k.rows(), k.cols(), mask);
  const ScoreFamily* scores = v.score();
  KernelFeatures f;
  VecD key_sum;
  if (!scores) {
    f = kernel_features(v, q, k, scale);
    key_sum = f.norm_k().colwise().sum().transpose();
  }
  std::vector<int> degenerate;
  MatD block(std::min(kRowBlock, q.rows()), k.rows());
  for (Eigen::Index r0 = 0; r0 < q.rows(); r0 += kRowBlock) {
    const Eigen::Index rows = std::min(kRowBlock, q.rows() - r0);
    auto b = block.topRows(rows);
    if (scores) {
      detail::count_product(rows, q.cols(), k.rows());
      portable::product_nt(q.middleRows(r0, rows), k, b);
      scores->rows(b, r0, scale, mask, degenerate);
    } else {
      detail::count_product(rows, f.q.cols(), f.k.rows());
      portable::product_nt(f.q.middleRows(r0, rows), f.k, b);
      kernel_rows(v, f.norm_q(), f.norm_k(), key_sum, b, r0, mask, degenerate);
    }
    sink(r0, b);
  }
  publish(diag, std::move(degenerate));
}

/// Scratch of the linear-time form, one per thread and kept between calls: each buffer grows to
/// the largest call seen and is then reused. Fresh buffers on every call would cost fresh pages
/// on every call once a buffer crosses malloc's mmap threshold (N x 64 doubles at N = 256).
class Scratch {
 public:
  enum Slot { kQ, kK, kV, kFeatQ, kFeatK, kOut, kKV, kKeySum, kValueSum, kNormQ, kNormK, kSlots };
  Eigen::Map<MatD> get(Slot slot, Eigen::Index rows, Eigen::Index cols) {
    Buffer& b = buffers_[slot];
    const auto need = static_cast<std::size_t>(rows * cols);
    if (b.size() < need) {
      b = Buffer(need);
      ++detail::thread_counters().scratch_growths;
    }
    return {b.data(), rows, cols};
  }

 private:
  // Aligned like every Eigen matrix: where a buffer starts must never change a result (a reduction
  // over an unaligned Map starts its vector lanes wherever the data becomes aligned, so the same
  // sum would come out in a different order from a buffer that malloc placed differently).
  using Buffer = std::vector<double, Eigen::aligned_allocator<double>>;
  std::array<Buffer, kSlots> buffers_;
};

Scratch& thread_scratch() {
  thread_local Scratch scratch;
  return scratch;
}

/// x as doubles: doubles pass through, floats are widened into the scratch slot.
template <typename T>
ConstRef<double> widened(ConstRef<T> x, Scratch& s, Scratch::Slot slot) {
  if constexpr (std::is_same_v<T, double>) {
    return x;
  } else {
    Eigen::Map<MatD> m = s.get(slot, x.rows(), x.cols());
    m = x.template cast<double>();
    return m;
  }
}

/// Linear-time outputs, no mask: o_i = a_i f_q(i) (F_k^T V) + b_i sum_j v_j, computed in
/// double in the thread's scratch and written into `out`.
template <typename T>
void linear_time_outputs(const Variant& v, ConstRef<T> q_in, ConstRef<T> k_in, ConstRef<T> v_in,
                         double scale, Eigen::Ref<Mat<T>> out, Diagnostics* diag) {
  Scratch& s = thread_scratch();
  const ConstRef<double> q = widened<T>(q_in, s, Scratch::kQ);
  const ConstRef<double> k = widened<T>(k_in, s, Scratch::kK);
  const ConstRef<double> values = widened<T>(v_in, s, Scratch::kV);
  const Eigen::Index r = detail::kernel_of(v).feature_dim(v, static_cast<int>(q.cols()));
  Eigen::Map<MatD> fq = s.get(Scratch::kFeatQ, q.rows(), r);
  Eigen::Map<MatD> fk = s.get(Scratch::kFeatK, k.rows(), r);
  detail::query_features_into(v, q, TokenPositions{}, k.rows(), scale, fq);
  detail::key_features_into(v, q, k, scale, fk);
  // S_i from the normaliser features where the family has its own (RoPE in the numerator only).
  const bool separate = detail::kernel_of(v).separate_normaliser(v);
  const Eigen::Index rg = separate ? detail::kernel_of(v).normaliser_dim(v, static_cast<int>(q.cols())) : r;
  Eigen::Map<MatD> gq = separate ? s.get(Scratch::kNormQ, q.rows(), rg) : fq;
  Eigen::Map<MatD> gk = separate ? s.get(Scratch::kNormK, k.rows(), rg) : fk;
  if (separate) detail::normaliser_features_into(v, q, k, scale, gq, gk);
  Eigen::Map<MatD> kv = s.get(Scratch::kKV, r, values.cols());  // d' x dv
  detail::count_product(r, k.rows(), values.cols());
  portable::product(fk.transpose(), values, kv);
  Eigen::Map<MatD> key_sum = s.get(Scratch::kKeySum, 1, rg);
  Eigen::Map<MatD> value_sum = s.get(Scratch::kValueSum, 1, values.cols());
  key_sum = gk.colwise().sum();
  value_sum = values.colwise().sum();
  const double key_sum_norm = key_sum.norm();
  std::vector<int> degenerate;
  const auto finish = [&](auto o) {
    detail::count_product(q.rows(), r, values.cols());
    portable::product(fq, kv, o);
    for (Eigen::Index i = 0; i < o.rows(); ++i) {
      const auto qi = gq.row(i);
      const RowForm rn = kernel_row_form(v, qi.dot(key_sum.row(0)), static_cast<int>(k.rows()),
                                         qi.norm() * key_sum_norm);
      if (rn.degenerate) {
        o.row(i).setZero();
        degenerate.push_back(static_cast<int>(i));
      } else {
        o.row(i) = rn.a * o.row(i) + rn.b * value_sum.row(0);
      }
    }
  };
  if constexpr (std::is_same_v<T, double>) {
    finish(Eigen::Ref<MatD>(out));
  } else {
    Eigen::Map<MatD> o = s.get(Scratch::kOut, q.rows(), values.cols());
    finish(Eigen::Ref<MatD>(o));
    out = o.template cast<T>();
  }
  require_finite(out, v, "attention outputs");
  publish(diag, std::move(degenerate));
}

void check_values(const Variant& v, Eigen::Index k_rows, Eigen::Index v_rows) {
  if (k_rows != v_rows) {
    throw UsageError(v.name() + ": " + std::to_string(v_rows) + " value rows for " +
                     std::to_string(k_rows) + " keys");
  }
}

template <typename T>
Mat<T> weights_impl(const Variant& v, ConstRef<double> q, ConstRef<double> k, double scale,
                    const Mask* mask, Diagnostics* diag) {
  Mat<T> out(q.rows(), k.rows());
  weight_blocks(v, q, k, scale, mask, diag, [&](Eigen::Index r0, const RowBlock& b) {
    out.middleRows(r0, b.rows()) = b.cast<T>();
  });
  require_finite(out, v, "attention weights");
  return out;
}

template <typename T>
Mat<T> outputs_impl(const Variant& v, ConstRef<double> q, ConstRef<double> k,
                    ConstRef<double> values, double scale, const Mask* mask, Diagnostics* diag) {
  detail::check_inputs(v, q.rows(), q.cols(), k.rows(), k.cols(), mask);
  check_values(v, k.rows(), values.rows());
  Mat<T> out(q.rows(), values.cols());
  weight_blocks(v, q, k, scale, mask, diag, [&](Eigen::Index r0, const RowBlock& b) {
    detail::count_product(b.rows(), b.cols(), values.cols());
    MatD block_out(b.rows(), values.cols());
    portable::product(b, values, block_out);
    out.middleRows(r0, b.rows()) = block_out.template cast<T>();
  });
  require_finite(out, v, "attention outputs");
  return out;
}

/// Everything is computed in double whatever T is: the InLine and MALA paper forms subtract terms
/// of size phi(q).sum phi(k), which float would resolve only to ~1e-7 of that size. Doubles pass
/// through without a copy; floats are widened into `storage`.
template <typename T>
ConstRef<double> as_double(ConstRef<T> x, MatD& storage) {
  if constexpr (std::is_same_v<T, double>) {
    return x;
  } else {
    storage = x.template cast<double>();
    return storage;
  }
}

}  // namespace

MatD kernel_weights(const Variant& v, const MatD& fq, const MatD& fk, Diagnostics* diag) {
  if (detail::kernel_of(v).separate_normaliser(v)) {
    throw UsageError(v.name() + ": its row form takes normaliser features of its own; kernel_weights "
                     "needs them (g_q, g_k)");
  }
  return kernel_weights(v, fq, fk, fq, fk, diag);
}

MatD kernel_weights(const Variant& v, const MatD& fq, const MatD& fk, const MatD& gq, const MatD& gk,
                    Diagnostics* diag) {
  (void)detail::kernel_of(v);
  if (fq.cols() != fk.cols() || gq.cols() != gk.cols() || gq.rows() != fq.rows() || gk.rows() != fk.rows()) {
    throw UsageError(v.name() + ": query features are " + std::to_string(fq.cols()) +
                     " wide, key features " + std::to_string(fk.cols()) + " (normaliser " +
                     std::to_string(gq.cols()) + ", " + std::to_string(gk.cols()) + ")");
  }
  const VecD key_sum = gk.colwise().sum().transpose();
  MatD w(fq.rows(), fk.rows());
  portable::product_nt(fq, fk, w);
  std::vector<int> degenerate;
  kernel_rows(v, gq, gk, key_sum, w, 0, nullptr, degenerate);
  require_finite(w, v, "attention weights");
  publish(diag, std::move(degenerate));
  return w;
}

template <typename T>
Mat<T> attention_weights(const Variant& v, ConstRef<T> q, ConstRef<T> k, double scale,
                         const Mask* mask, Diagnostics* diag) {
  MatD qs, ks;
  return weights_impl<T>(v, as_double<T>(q, qs), as_double<T>(k, ks), scale, mask, diag);
}

template <typename T>
Mat<T> attention_outputs(const Variant& v, ConstRef<T> q, ConstRef<T> k, ConstRef<T> v_in,
                         double scale, const Mask* mask, Diagnostics* diag) {
  if (!mask && v.linear_time_outputs()) {
    Mat<T> out(q.rows(), v_in.cols());
    attention_outputs_into<T>(v, q, k, v_in, scale, out, nullptr, diag);
    return out;
  }
  MatD qs, ks, vs;
  return outputs_impl<T>(v, as_double<T>(q, qs), as_double<T>(k, ks), as_double<T>(v_in, vs), scale,
                         mask, diag);
}

template <typename T>
void attention_outputs_into(const Variant& v, ConstRef<T> q, ConstRef<T> k, ConstRef<T> v_in,
                            double scale, Eigen::Ref<Mat<T>> out, const Mask* mask,
                            Diagnostics* diag) {
  detail::check_inputs(v, q.rows(), q.cols(), k.rows(), k.cols(), mask);
  check_values(v, k.rows(), v_in.rows());
  if (out.rows() != q.rows() || out.cols() != v_in.cols()) {
    throw UsageError(v.name() + ": output is " + std::to_string(out.rows()) + " x " +
                     std::to_string(out.cols()) + ", expected " + std::to_string(q.rows()) + " x " +
                     std::to_string(v_in.cols()));
  }
  if (!mask && v.linear_time_outputs()) {
    linear_time_outputs<T>(v, q, k, v_in, scale, out, diag);
    return;
  }
  MatD qs, ks, vs;
  out = outputs_impl<T>(v, as_double<T>(q, qs), as_double<T>(k, ks), as_double<T>(v_in, vs), scale,
                        mask, diag);
}

template <typename T>
Mat<T> attention_outputs_explicit(const Variant& v, ConstRef<T> q, ConstRef<T> k,
                                  const Mat<T>& v_in, double scale, const Mask* mask,
                                  Diagnostics* diag) {
  MatD qs, ks, vs;
  return outputs_impl<T>(v, as_double<T>(q, qs), as_double<T>(k, ks), as_double<T>(v_in, vs), scale,
                         mask, diag);
}

#define ATTNSCOPE_INSTANTIATE(T)                                                                   \
  template Mat<T> attention_weights<T>(const Variant&, ConstRef<T>, ConstRef<T>, double,           \
                                       const Mask*, Diagnostics*);                                 \
  template Mat<T> attention_outputs<T>(const Variant&, ConstRef<T>, ConstRef<T>, ConstRef<T>,      \
                                       double, const Mask*, Diagnostics*);                         \
  template Mat<T> attention_outputs_explicit<T>(const Variant&, ConstRef<T>, ConstRef<T>,          \
                                                const Mat<T>&, double, const Mask*, Diagnostics*); \
  template void attention_outputs_into<T>(const Variant&, ConstRef<T>, ConstRef<T>, ConstRef<T>,   \
                                          double, Eigen::Ref<Mat<T>>, const Mask*, Diagnostics*);
ATTNSCOPE_INSTANTIATE(float)
ATTNSCOPE_INSTANTIATE(double)
#undef ATTNSCOPE_INSTANTIATE

}  // namespace attnscope
