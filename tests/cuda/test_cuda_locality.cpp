// Local k x k mass on the GPU against the CPU's double reference: within 1e-6 on every grid
// query, NaN in the same places, the same degenerate counts.
#include "attnscope/analyses/locality.hpp"
#include "cuda_test.hpp"
#include "gpu_cases.hpp"

#include <cmath>

namespace attnscope::test {
namespace {

using CudaLocality = CudaTest;

TEST_F(CudaLocality, MassWithinOneMillionthOfTheCpu) {
  const TokenGrid grids[] = {{0, 1, 1}, {1, 1, 1}, {1, 7, 7}, {1, 14, 14}, {2, 5, 9}};
  std::uint64_t seed = 90;
  for (const char* spec : {"softmax", "linear:relu", "linear:elu1", "inline", "mala", "cosformer", "efficient"}) {
    for (const TokenGrid& g : grids) {
      for (int window : {1, 3, 5}) {
        const int n = g.tokens(), d = 16;
        const Variant v = parse_variant(spec, Convention::Paper, ++seed);
        const MatF q = normal_f(n, d, seed, input_mean(v)), k = normal_f(n, d, seed + 1, input_mean(v));
        const double scale = 0.25;
        const std::string what = case_label("window " + std::to_string(window), v, n, d, seed);
        int dead_cpu = -1, dead_gpu = -2;
        const auto cpu = analyses::local_mass_reference(v, q, k, scale, g, window, &dead_cpu);
        const auto gpu = analyses::local_mass_cuda(v, q, k, scale, g, window, &dead_gpu);
        EXPECT_EQ(dead_gpu, dead_cpu) << what;
        ASSERT_EQ(gpu.size(), cpu.size()) << what;
        for (std::size_t i = 0; i < cpu.size(); ++i) {
          ASSERT_EQ(std::isnan(gpu[i]), std::isnan(cpu[i])) << what << " token " << i;
          if (!std::isnan(cpu[i])) {
            EXPECT_NEAR(gpu[i], cpu[i], 1e-6) << what << " token " << i;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace attnscope::test
