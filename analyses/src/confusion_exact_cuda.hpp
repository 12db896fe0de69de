// ExactRows's rows on the device (confusion_exact.cpp computes them on the host): from the same
// inputs, so that the GPU's rows and the exact judge's share every one: softmax from q and k as
// they are (widened on the device), the kernel form from ExactRows's features and row forms.
// Shared by the GPU paths of confusion (confusion_cuda.cpp) and locality (locality_cuda.cpp);
// only in a build with CUDA.
#pragma once

#ifdef ATTNSCOPE_HAVE_CUDA

#include "attnscope/analyses/confusion.hpp"
#include "attnscope/gpu/attention.hpp"
#include "weights.cuh"

#include <cstddef>
#include <vector>

namespace attnscope::analyses::detail {

/// One byte per row of `rows`: 1 where the row is degenerate.
inline std::vector<unsigned char> degenerate_flags(const ExactRows& rows) {
  std::vector<unsigned char> flags(static_cast<std::size_t>(rows.tokens()));
  for (int i = 0; i < rows.tokens(); ++i)
    flags[static_cast<std::size_t>(i)] = rows.degenerate(i) ? 1 : 0;
  return flags;
}

/// The head's rows on the device (left in the calling thread's context), `flags` its
/// degenerate_flags. q, k are the head's (as given to ExactRows).
inline cuda::DeviceRows device_rows(const ExactRows& rows, const MatF& q, const MatF& k,
                                    double scale, const std::vector<unsigned char>& flags) {
  cuda::Context& ctx = cuda::this_thread_context();
  const int n = rows.tokens();
  if (gpu::score_rows_on_gpu(rows.variant())) {
    return cuda::softmax_rows(ctx, q.data(), k.data(), 1, n, static_cast<int>(q.cols()), scale);
  }
  std::vector<double> a(static_cast<std::size_t>(n)), b(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    a[static_cast<std::size_t>(i)] = rows.row_coefficient(i);
    b[static_cast<std::size_t>(i)] = rows.row_offset(i);
  }
  return cuda::kernel_rows(ctx, rows.phi_q().data(), rows.phi_k().data(), a.data(), b.data(),
                           flags.data(), 1, n, static_cast<int>(rows.phi_q().cols()));
}

}  // namespace attnscope::analyses::detail

#endif
