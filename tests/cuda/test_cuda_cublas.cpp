// cuBLAS is loaded on first use, not linked (context.cuh's cublas()): the loader finds the library
// of the headers' major version and every function the GPU paths call. No device is needed: these
// run wherever the CUDA paths are built. (cli.device_flags checks that the command does not link
// libcublas, so a CPU run never loads it.)
#include "context.cuh"

#include <gtest/gtest.h>

#include <string>

namespace attnscope::cuda {
namespace {

TEST(CudaCublas, LoadedOnFirstUseWithEveryFunction) {
  const Cublas& c = cublas();
  EXPECT_NE(c.create, nullptr);
  EXPECT_NE(c.destroy, nullptr);
  EXPECT_NE(c.set_stream, nullptr);
  EXPECT_NE(c.set_math_mode, nullptr);
  EXPECT_NE(c.status_string, nullptr);
  EXPECT_NE(c.dgemm_strided_batched, nullptr);
  // A host-only call through the loaded library: the status strings.
  const std::string ok = c.status_string(CUBLAS_STATUS_SUCCESS);
  const std::string bad = c.status_string(CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_FALSE(ok.empty());
  EXPECT_NE(ok, bad);
  EXPECT_EQ(&cublas(), &c);  // loaded once
}

}  // namespace
}  // namespace attnscope::cuda
