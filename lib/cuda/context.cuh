// The per-thread CUDA context of the GPU paths: one stream, one cuBLAS handle and grow-only device
// and pinned host buffers per host thread, so that the OpenMP threads of an analysis each feed
// the device on their own stream (one thread's copies overlap another's compute) and nothing is
// allocated again once the largest head has been seen.
//
// Layout as everywhere (layout.hpp): matrices are row-major, heads of a batch follow one another.
// Only CUDA code includes this header; the analyses call the host APIs of the kernel headers.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <initializer_list>
#include <string>

namespace attnscope::cuda {

/// Throws attnscope::NumericalError "cuda: <what>: <the runtime's message>" on failure.
void check(cudaError_t err, const char* what);
void check(cublasStatus_t status, const char* what);

/// cuBLAS, loaded on first use (dlopen of libcublas.so.<major of the headers>), not linked:
/// loading libcublas and libcublasLt costs every process about 0.1 s and 200 MB of resident
/// memory, which a run on the CPU would pay for nothing. The functions the GPU paths call, under
/// the headers' names (cublasCreate is cublasCreate_v2, ...). The first call throws UsageError
/// naming the library when it cannot be loaded or lacks a function.
struct Cublas {
  decltype(&cublasCreate) create = nullptr;
  decltype(&cublasDestroy) destroy = nullptr;
  decltype(&cublasSetStream) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
  decltype(&cublasDgemmStridedBatched) dgemm_strided_batched = nullptr;
};
const Cublas& cublas();

/// Where a GrowingBuffer lives: device memory, or page-locked host memory (the source and target
/// of asynchronous copies).
enum class Memory { Device, Pinned };

/// Memory that only grows; contents are not kept across growth.
template <Memory Where>
class GrowingBuffer {
 public:
  GrowingBuffer() = default;
  GrowingBuffer(const GrowingBuffer&) = delete;
  GrowingBuffer& operator=(const GrowingBuffer&) = delete;
  ~GrowingBuffer();
  /// At least `bytes` bytes; returns the (possibly new) address.
  void* reserve(std::size_t bytes);
  template <typename T>
  T* as(std::size_t count) {
    return static_cast<T*>(reserve(count * sizeof(T)));
  }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};
using DeviceBuffer = GrowingBuffer<Memory::Device>;
using PinnedBuffer = GrowingBuffer<Memory::Pinned>;

/// The buffers the kernels of one thread share. Each is named for what it holds.
struct Context {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  DeviceBuffer q, k;          // float inputs, batch x n x d
  DeviceBuffer fq, fk;        // double features, batch x n x r
  DeviceBuffer a, b;          // row forms, batch x n
  DeviceBuffer rows;          // double attention rows, batch x n x n
  DeviceBuffer gram;          // batch x n x n
  DeviceBuffer bound;         // R_i, batch x n
  DeviceBuffer flags;         // degenerate rows, batch x n bytes
  DeviceBuffer pairs, count;  // candidate pairs and their count
  DeviceBuffer windows;       // window offsets and indices (local mass)
  DeviceBuffer mass;          // batch x n
  DeviceBuffer kept;          // masks, batch x n x n bytes
  DeviceBuffer values;        // V and the outputs, batch x n x dv each
  PinnedBuffer staging_in, staging_out;
  PinnedBuffer inputs;        // float inputs written in place by the host (softmax_inputs)

  Context();
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  /// One host-to-device copy of an upload.
  struct Copy {
    void* device;
    const void* host;
    std::size_t bytes;
  };
  /// Copies every input of one launch through the pinned staging area, asynchronously on the
  /// stream (after waiting for the stream's earlier copies out of that area).
  void upload(std::initializer_list<Copy> copies);
  /// Copies `bytes` from `device` to `host` through pinned memory and waits for the stream.
  void download(void* host, const void* device, std::size_t bytes);
  void synchronize();
};

/// Row-major P_b = alpha X_b Y_b^T (n x n) for every head b of a batch, X and Y batch x n x c
/// (device memory), by one strided-batched DGEMM on the context's stream.
void products(Context& ctx, const double* x, const double* y, double* p, int batch, int n, int c, double alpha);

/// The calling thread's context (created on first use, on device 0).
Context& this_thread_context();

}  // namespace attnscope::cuda
