// Attention rows of a batch of heads on the device, in double: softmax's score form and the
// kernel form w_ij = a_i f_q(i).f_k(j) + b_i of every other family. The kernels know no family:
// the kernel form's features and row forms come from the registry (family.hpp) on the host.
// Products by cuBLAS (DGEMM, strided over the batch); rows land in the context's `rows` buffer,
// batch x n x n row-major, valid until the thread's next launch.
#pragma once

namespace attnscope::cuda {

struct Context;
/// The calling thread's stream, cuBLAS handle and buffers (context.cuh), created on first use.
Context& this_thread_context();

/// Rows of a batch on the device.
struct DeviceRows {
  const double* data = nullptr;  ///< batch x n x n, row-major
  int batch = 0;
  int n = 0;
};

/// Softmax rows: q, k (float, batch x n x d each) are copied as they are and widened on the
/// device; logits s q_i.k_j by DGEMM, then per row the max subtracted, exp, and the division by
/// the sum, the steps of softmax_exact_row (softmax.hpp).
DeviceRows softmax_rows(Context& ctx, const float* q, const float* k, int batch, int n, int d, double scale);

/// Kernel-form rows from the features f_q, f_k (double, batch x n x r) and the row forms a, b
/// (batch x n); rows with degenerate[row] != 0 are written as zeros (attention.hpp).
DeviceRows kernel_rows(Context& ctx, const double* fq, const double* fk, const double* a, const double* b,
                       const unsigned char* degenerate, int batch, int n, int r);

/// Copies the rows to host memory (batch x n x n doubles).
void download_rows(Context& ctx, const DeviceRows& rows, double* out);

}  // namespace attnscope::cuda
