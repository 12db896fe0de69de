// Attention of one head on the GPU (gpu/attention.hpp). The host prepares what the kernels take
// from the family registry (the kernel form's features and row forms, as attention.cpp computes
// them: from S_i over all keys, or over the kept keys and their count under a mask) and the masks
// as bytes; the rows and the products run on the device (lib/cuda/weights.cuh).
#include "attnscope/gpu/attention.hpp"

#include "attnscope/device.hpp"
#include "attnscope/error.hpp"
#include "attnscope/family.hpp"

#ifdef ATTNSCOPE_HAVE_CUDA
#include "weights.cuh"
#endif

#include <string>
#include <utility>
#include <vector>

namespace attnscope::gpu {

bool score_rows_on_gpu(const Variant& v) {
  const ScoreFamily* score = v.score();
  if (score == nullptr) return false;
  if (!score->rows_are_softmax()) {
    throw UsageError("--device cuda: " + v.name() + " has no GPU path (its score rows are not the GPU kernels' "
                     "softmax rows); run it with --device cpu");
  }
  return true;
}

#ifdef ATTNSCOPE_HAVE_CUDA

namespace {

/// Row forms of the kernel form, as attention.cpp's kernel_rows computes them: from S_i over all
/// keys, or over the kept keys and their count under a mask.
struct RowForms {
  std::vector<double> a, b;
  std::vector<unsigned char> degenerate;
};

RowForms row_forms(const Variant& v, const MatD& fq, const MatD& fk, const Mask* mask) {
  const Eigen::Index n = fq.rows();
  RowForms out;
  out.a.assign(static_cast<std::size_t>(n), 0.0);
  out.b.assign(static_cast<std::size_t>(n), 0.0);
  out.degenerate.assign(static_cast<std::size_t>(n), 0);
  const VecD key_sum = fk.colwise().sum().transpose();
  const double key_sum_norm = key_sum.norm();
  MatD kept_sums;
  if (mask) kept_sums.noalias() = mask->cast<double>().matrix() * fk;
  for (Eigen::Index i = 0; i < n; ++i) {
    const auto qi = fq.row(i);
    const RowForm rn =
        mask ? kernel_row_form(v, qi.dot(kept_sums.row(i)), static_cast<int>(mask->row(i).count()),
                               qi.norm() * kept_sums.row(i).norm())
             : kernel_row_form(v, qi.dot(key_sum.transpose()), static_cast<int>(fk.rows()),
                               qi.norm() * key_sum_norm);
    const auto r = static_cast<std::size_t>(i);
    out.degenerate[r] = rn.degenerate ? 1 : 0;
    if (!rn.degenerate) out.a[r] = rn.a, out.b[r] = rn.b;
  }
  return out;
}

void check_head(const Variant& v, const MatD& q, const MatD& k, const Mask* mask) {
  std::string why;
  if (!v.supports(&why)) throw UsageError(why);
  if (k.rows() < 1) throw UsageError(v.name() + ": no keys");
  if (q.cols() != k.cols() || q.rows() != k.rows()) {
    throw UsageError(v.name() + ": the GPU path takes q and k of one shape, found " +
                     std::to_string(q.rows()) + " x " + std::to_string(q.cols()) + " and " +
                     std::to_string(k.rows()) + " x " + std::to_string(k.cols()));
  }
  if (mask && (mask->rows() != q.rows() || mask->cols() != k.rows())) {
    throw UsageError(v.name() + ": mask is " + std::to_string(mask->rows()) + " x " +
                     std::to_string(mask->cols()) + ", expected " + std::to_string(q.rows()) +
                     " x " + std::to_string(k.rows()));
  }
}

/// The head's weights on the device (left in the thread's context); degenerate rows listed.
cuda::DeviceRows device_weights(const Variant& v, const MatD& q, const MatD& k, double scale,
                                const Mask* mask, std::vector<int>& degenerate) {
  check_head(v, q, k, mask);
  cuda::Context& ctx = cuda::this_thread_context();
  const int n = static_cast<int>(q.rows());
  std::vector<unsigned char> kept;
  if (mask) {
    kept.resize(static_cast<std::size_t>(n) * static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) kept[static_cast<std::size_t>(i) * n + j] = (*mask)(i, j) ? 1 : 0;
    }
  }
  degenerate.clear();
  if (score_rows_on_gpu(v)) {
    for (int i = 0; mask && i < n; ++i) {
      if (!mask->row(i).any()) degenerate.push_back(i);
    }
    return cuda::softmax_rows(ctx, q.data(), k.data(), mask ? kept.data() : nullptr, 1, n,
                              static_cast<int>(q.cols()), scale);
  }
  const KernelFeatures f = kernel_features(v, q, k, scale);
  const RowForms rf =
      row_forms(v, f.norm_q(), f.norm_k(), mask);  // S_i from g where the family has its own
  for (int i = 0; i < n; ++i) {
    if (rf.degenerate[static_cast<std::size_t>(i)]) degenerate.push_back(i);
  }
  return cuda::kernel_rows(ctx, f.q.data(), f.k.data(), rf.a.data(), rf.b.data(),
                           rf.degenerate.data(), 1, n, static_cast<int>(f.q.cols()),
                           mask ? kept.data() : nullptr);
}

template <typename Derived>
void require_finite(const Eigen::DenseBase<Derived>& x, const Variant& v, const char* what) {
  if (!x.allFinite()) {
    throw NumericalError(v.name() + ": " + what +
                         " overflow double (inputs too large in magnitude)");
  }
}

}  // namespace

MatD attention_weights(const Variant& v, const MatD& q, const MatD& k, double scale,
                       const Mask* mask, Diagnostics* diag) {
  std::vector<int> degenerate;
  const cuda::DeviceRows dr = device_weights(v, q, k, scale, mask, degenerate);
  MatD w(q.rows(), k.rows());
  cuda::download_rows(cuda::this_thread_context(), dr, w.data());
  require_finite(w, v, "attention weights");
  if (diag) diag->degenerate_rows = std::move(degenerate);
  return w;
}

MatD attention_outputs(const Variant& v, const MatD& q, const MatD& k, const MatD& values,
                       double scale, const Mask* mask, Diagnostics* diag) {
  std::vector<int> degenerate;
  const cuda::DeviceRows dr = device_weights(v, q, k, scale, mask, degenerate);
  MatD o(q.rows(), values.cols());
  cuda::outputs(cuda::this_thread_context(), dr, values.data(), static_cast<int>(values.cols()),
                o.data());
  require_finite(o, v, "attention outputs");
  if (diag) diag->degenerate_rows = std::move(degenerate);
  return o;
}

WeightsAndOutputs attention_weights_and_outputs(const Variant& v, const MatD& q, const MatD& k,
                                                const MatD& values, double scale, const Mask* mask,
                                                Diagnostics* diag) {
  cuda::Context& ctx = cuda::this_thread_context();
  std::vector<int> degenerate;
  const cuda::DeviceRows dr = device_weights(v, q, k, scale, mask, degenerate);
  WeightsAndOutputs out{MatD(q.rows(), k.rows()), MatD(q.rows(), values.cols())};
  cuda::download_rows(ctx, dr, out.weights.data());
  require_finite(out.weights, v, "attention weights");
  cuda::outputs(ctx, dr, values.data(), static_cast<int>(values.cols()), out.outputs.data());
  if (diag) diag->degenerate_rows = std::move(degenerate);
  return out;
}

#else

MatD attention_weights(const Variant&, const MatD&, const MatD&, double, const Mask*,
                       Diagnostics*) {
  refuse_without_cuda();
}

MatD attention_outputs(const Variant&, const MatD&, const MatD&, const MatD&, double, const Mask*,
                       Diagnostics*) {
  refuse_without_cuda();
}

WeightsAndOutputs attention_weights_and_outputs(const Variant&, const MatD&, const MatD&,
                                                const MatD&, double, const Mask*, Diagnostics*) {
  refuse_without_cuda();
}

#endif

}  // namespace attnscope::gpu
