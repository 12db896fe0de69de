#include "context.cuh"

#include "weights.cuh"

#include "attnscope/error.hpp"

#include <dlfcn.h>

#include <cstring>
#include <type_traits>

namespace attnscope::cuda {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw NumericalError(std::string("cuda: ") + what + ": " + cudaGetErrorString(err));
  }
}

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw NumericalError(std::string("cuda: ") + what + ": " + cublas().status_string(status));
  }
}

// A macro's expansion as a string: the symbol behind a cuBLAS name (cublasCreate -> "cublasCreate_v2").
#define ATTNSCOPE_STR2(x) #x
#define ATTNSCOPE_STR(x) ATTNSCOPE_STR2(x)
#ifndef ATTNSCOPE_CUBLAS_DIR
#define ATTNSCOPE_CUBLAS_DIR "/usr/local/cuda/lib64"
#endif

const Cublas& cublas() {
  static const Cublas loaded = [] {
    const char* soname = "libcublas.so." ATTNSCOPE_STR(CUBLAS_VER_MAJOR);
    // The loader's own search first (LD_LIBRARY_PATH, ld.so.cache), then the toolkit's folder of
    // the build and the usual toolkit folders.
    const std::string tries[] = {soname, std::string(ATTNSCOPE_CUBLAS_DIR) + "/" + soname,
                                 std::string("/usr/local/cuda/lib64/") + soname,
                                 std::string("/usr/local/cuda/lib/") + soname};
    void* lib = nullptr;
    std::string why;
    for (const std::string& path : tries) {
      lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) break;
      if (why.empty()) {
        const char* e = dlerror();
        why = e ? e : "not found";
      }
    }
    if (lib == nullptr) {
      throw UsageError(std::string("--device cuda: cannot load ") + soname + " (" + why +
                       "): install the CUDA toolkit's cuBLAS or add its folder to LD_LIBRARY_PATH");
    }
    Cublas c;
    const auto bind = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (fn == nullptr) throw UsageError(std::string("--device cuda: ") + soname + " has no " + name);
    };
    bind(c.create, ATTNSCOPE_STR(cublasCreate));
    bind(c.destroy, ATTNSCOPE_STR(cublasDestroy));
    bind(c.set_stream, ATTNSCOPE_STR(cublasSetStream));
    bind(c.set_math_mode, ATTNSCOPE_STR(cublasSetMathMode));
    bind(c.status_string, ATTNSCOPE_STR(cublasGetStatusString));
    bind(c.dgemm_strided_batched, ATTNSCOPE_STR(cublasDgemmStridedBatched));
    return c;  // the library stays loaded for the process's lifetime
  }();
  return loaded;
}

namespace {

cudaError_t allocate(Memory where, void** p, std::size_t bytes) {
  return where == Memory::Device ? cudaMalloc(p, bytes) : cudaMallocHost(p, bytes);
}

cudaError_t release(Memory where, void* p) {
  return where == Memory::Device ? cudaFree(p) : cudaFreeHost(p);
}

}  // namespace

template <Memory Where>
GrowingBuffer<Where>::~GrowingBuffer() {
  if (ptr_) release(Where, ptr_);
}

template <Memory Where>
void* GrowingBuffer<Where>::reserve(std::size_t bytes) {
  if (bytes <= bytes_ && ptr_) return ptr_;
  if (ptr_) check(release(Where, ptr_), "freeing a buffer");
  ptr_ = nullptr;
  bytes_ = 0;
  check(allocate(Where, &ptr_, bytes > 0 ? bytes : 1),
        Where == Memory::Device ? "cudaMalloc" : "cudaMallocHost");
  bytes_ = bytes;
  return ptr_;
}

template class GrowingBuffer<Memory::Device>;
template class GrowingBuffer<Memory::Pinned>;

Context::Context() {
  check(cudaSetDevice(0), "cudaSetDevice");
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cublas().create(&blas), "cublasCreate");
  check(cublas().set_stream(blas, stream), "cublasSetStream");
  // Plain IEEE double products (FP64 tensor cores are IEEE fused multiply-adds): the error bounds
  // of candidate_margin.hpp assume nothing else.
  check(cublas().set_math_mode(blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
}

Context::~Context() {
  if (blas) cublas().destroy(blas);
  if (stream) cudaStreamDestroy(stream);
}

void Context::upload(std::initializer_list<Copy> copies) {
  // The staging area may be reallocated and is rewritten below: no earlier copy may still read it.
  synchronize();
  std::size_t total = 0;
  for (const Copy& c : copies) total += (c.bytes + 255) / 256 * 256;
  char* stage = static_cast<char*>(staging_in.reserve(total));
  for (const Copy& c : copies) {
    if (c.bytes == 0) continue;
    std::memcpy(stage, c.host, c.bytes);
    check(cudaMemcpyAsync(c.device, stage, c.bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync (upload)");
    stage += (c.bytes + 255) / 256 * 256;
  }
}

void Context::download(void* host, const void* device, std::size_t bytes) {
  void* stage = staging_out.reserve(bytes);
  check(cudaMemcpyAsync(stage, device, bytes, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync (download)");
  synchronize();
  std::memcpy(host, stage, bytes);
}

void Context::synchronize() { check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); }

/// Row-major P_b = X_b Y_b^T (n x n) for every head b of the batch, X and Y batch x n x c; alpha
/// scales the products. Column-major cuBLAS sees row-major P^T = Y X^T with X^T, Y^T stored as
/// c x n matrices.
void products(Context& ctx, const double* x, const double* y, double* p, int batch, int n, int c, double alpha) {
  const double beta = 0.0;
  const long long stride_in = static_cast<long long>(n) * c, stride_out = static_cast<long long>(n) * n;
  check(cublas().dgemm_strided_batched(ctx.blas, CUBLAS_OP_T, CUBLAS_OP_N, n, n, c, &alpha, y, c, stride_in, x, c,
                                  stride_in, &beta, p, n, stride_out, batch),
        "cublasDgemmStridedBatched (products)");
}

long long free_memory_bytes() {
  this_thread_context();  // the device is selected
  std::size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return static_cast<long long>(free);
}

Context& this_thread_context() {
  // Never destroyed: a thread_local's destructor may run after the CUDA runtime has shut down at
  // process exit, where cublasDestroy and cudaFree are undefined. The driver frees it all at exit.
  thread_local Context* ctx = new Context;
  return *ctx;
}

}  // namespace attnscope::cuda
