// Attention rows of a batch of heads on the device, in double: softmax's score form and the
// kernel form w_ij = a_i f_q(i).f_k(j) + b_i of every other family. The kernels know no family:
// the kernel form's features and row forms come from the registry (family.hpp) on the host.
// Products by cuBLAS (DGEMM, strided over the batch); rows land in the context's `rows` buffer,
// batch x n x n row-major, valid until the thread's next launch.
#pragma once

#include <cstdint>

namespace attnscope::cuda {

struct Context;
/// The calling thread's stream, cuBLAS handle and buffers (context.cuh), created on first use.
Context& this_thread_context();

/// Free device memory now (cudaMemGetInfo), for sizing launches.
long long free_memory_bytes();

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

/// Page-locked host memory for the inputs of softmax_rows_pinned: q of every head, then k of
/// every head (float, batch x n x d each). The caller writes them in place, so the batch is copied
/// to the device straight from there, with no staging copy. Waits for the stream first: the area
/// is the source of the previous launch's copy.
float* softmax_inputs(Context& ctx, int batch, int n, int d);

/// softmax_rows of the inputs written to softmax_inputs (the same rows as softmax_rows on them).
DeviceRows softmax_rows_pinned(Context& ctx, int batch, int n, int d, double scale);

/// The same from float16 inputs (IEEE binary16 bits, as a float16 dump stores them): copied as
/// float16, half the bytes of float, and widened on the device (exactly, as half.hpp does on the
/// host), so the rows equal softmax_rows' on the widened values.
DeviceRows softmax_rows_half(Context& ctx, const std::uint16_t* q, const std::uint16_t* k, int batch, int n, int d,
                             double scale);

/// The same from double inputs (copied as they are), over the keys `kept` keeps (batch x n x n
/// bytes, row i the keys query i keeps; null: all): softmax over the kept logits, zeros
/// elsewhere; a row that keeps no key is all zeros (attention.hpp's Mask).
DeviceRows softmax_rows(Context& ctx, const double* q, const double* k, const unsigned char* kept, int batch, int n,
                        int d, double scale);

/// Kernel-form rows from the features f_q, f_k (double, batch x n x r) and the row forms a, b
/// (batch x n); rows with degenerate[row] != 0 are written as zeros (attention.hpp). With `kept`
/// (batch x n x n bytes, or null) the keys a query does not keep get 0 (the row forms must then be
/// the masked ones, from the kept sums).
DeviceRows kernel_rows(Context& ctx, const double* fq, const double* fk, const double* a, const double* b,
                       const unsigned char* degenerate, int batch, int n, int r, const unsigned char* kept = nullptr);

/// Outputs O = W V of every head (V: batch x n x dv doubles), by DGEMM, copied to `out`
/// (batch x n x dv).
void outputs(Context& ctx, const DeviceRows& rows, const double* values, int dv, double* out);

/// Copies the rows to host memory (batch x n x n doubles).
void download_rows(Context& ctx, const DeviceRows& rows, double* out);

}  // namespace attnscope::cuda
