// Masking on the GPU (weights and both outputs) against the CPU's mask_head: the same counts of
// degenerate and empty rows, the same change and removed mass to rounding, every family.
#include "attnscope/analyses/masking.hpp"
#include "cuda_test.hpp"
#include "gpu_cases.hpp"

namespace attnscope::test {
namespace {

using CudaMasking = CudaTest;

TEST_F(CudaMasking, MaskHeadMatchesTheCpu) {
  const TokenGrid grid{1, 7, 7};
  const int n = grid.tokens(), d = 16, dv = 16;
  std::uint64_t seed = 500;
  for (const std::string& spec : all_variant_specs()) {
    const Variant v = parse_variant(spec, Convention::Paper, ++seed);
    const MatD q = normal_f(n, d, seed, input_mean(v)).cast<double>();
    const MatD k = normal_f(n, d, seed + 1, input_mean(v)).cast<double>();
    const MatD values = normal_f(n, dv, seed + 2).cast<double>();
    for (const char* m : {"local:3", "local:7", "random:9"}) {
      const analyses::MaskSpec ms = analyses::parse_mask_specs(m).front();
      const Mask mask = analyses::build_mask(ms, grid, seed);
      const std::string what = case_label(std::string("mask ") + m, v, n, d, seed);
      analyses::MaskCell cpu;
      try {
        cpu = analyses::mask_head(v, q, k, values, 0.25, mask);
      } catch (const NumericalError&) {
        EXPECT_THROW((void)analyses::mask_head_cuda(v, q, k, values, 0.25, mask), NumericalError) << what;
        continue;
      }
      const analyses::MaskCell gpu = analyses::mask_head_cuda(v, q, k, values, 0.25, mask);
      EXPECT_EQ(gpu.degenerate_rows, cpu.degenerate_rows) << what;
      EXPECT_EQ(gpu.empty_rows, cpu.empty_rows) << what;
      EXPECT_EQ(gpu.unmeasured_heads, cpu.unmeasured_heads) << what;
      ASSERT_EQ(gpu.change.count, cpu.change.count) << what;
      ASSERT_EQ(gpu.removed_mass.count, cpu.removed_mass.count) << what;
      EXPECT_NEAR(gpu.change.mean, cpu.change.mean, 1e-9 * (1.0 + std::abs(cpu.change.mean))) << what;
      EXPECT_NEAR(gpu.removed_mass.mean, cpu.removed_mass.mean, 1e-9 * (1.0 + std::abs(cpu.removed_mass.mean)))
          << what;
      EXPECT_NEAR(gpu.removed_mass.min, cpu.removed_mass.min, 1e-9 * (1.0 + std::abs(cpu.removed_mass.min))) << what;
      EXPECT_NEAR(gpu.removed_mass.max, cpu.removed_mass.max, 1e-9 * (1.0 + std::abs(cpu.removed_mass.max))) << what;
    }
  }
}

}  // namespace
}  // namespace attnscope::test
