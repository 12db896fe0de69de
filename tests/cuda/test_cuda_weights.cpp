// Explicit weights on the GPU against the CPU's (attention.hpp), every family of the registry,
// awkward sizes: the same numbers to rounding, the same degenerate rows.
#include "attnscope/analyses/confusion_cuda.hpp"
#include "attnscope/attention.hpp"
#include "attnscope/gpu/attention.hpp"
#include "attnscope/half.hpp"
#include "cuda_test.hpp"
#include "gpu_cases.hpp"
#include "random_inputs.hpp"
#include "variant_specs.hpp"
#include "weights.cuh"

#include <algorithm>
#include <memory>
#include <tuple>
#include <vector>

namespace attnscope::test {
namespace {

using CudaWeights = CudaTest;

TEST_F(CudaWeights, MatchTheCpuForEveryFamilyAndAwkwardSize) {
  std::uint64_t seed = 40;
  for (const std::string& spec : all_variant_specs()) {
    for (int n : kAwkwardN) {
      for (int d : kAwkwardD) {
        const Variant v = parse_variant(spec, Convention::Paper, ++seed);
        const MatF q = normal_f(n, d, seed, input_mean(v)), k = normal_f(n, d, seed + 1, input_mean(v));
        const double scale = 1.0 / std::sqrt(static_cast<double>(d));
        const std::string what = case_label("weights", v, n, d, seed);
        Diagnostics cpu_diag, gpu_diag;
        MatD cpu;
        try {
          cpu = attention_weights<double>(v, q.cast<double>(), k.cast<double>(), scale, nullptr, &cpu_diag);
        } catch (const NumericalError&) {
          continue;  // out of range for this family on the CPU already
        }
        const MatD gpu = gpu::attention_weights(v, q.cast<double>(), k.cast<double>(), scale,
                                                nullptr, &gpu_diag);
        ASSERT_EQ(gpu.rows(), n) << what;
        ASSERT_EQ(gpu.cols(), n) << what;
        EXPECT_EQ(gpu_diag.degenerate_rows, cpu_diag.degenerate_rows) << what;
        Eigen::Index wi = 0, wj = 0;
        const double worst = (gpu - cpu).cwiseAbs().maxCoeff(&wi, &wj);
        const double size = 1.0 + cpu.cwiseAbs().maxCoeff();
        EXPECT_LE(worst, 1e-10 * size) << what << " worst at (" << wi << ", " << wj << "): gpu " << gpu(wi, wj)
                                       << " cpu " << cpu(wi, wj);
      }
    }
  }
}

TEST_F(CudaWeights, MaskedWeightsMatchTheCpu) {
  const TokenGrid grid{1, 7, 7};
  const int n = grid.tokens(), d = 16;
  std::uint64_t seed = 300;
  for (const std::string& spec : all_variant_specs()) {
    const Variant v = parse_variant(spec, Convention::Paper, ++seed);
    const MatD q = normal_f(n, d, seed, input_mean(v)).cast<double>(), k = normal_f(n, d, seed + 1, input_mean(v)).cast<double>();
    for (const Mask& mask : {local_window_mask(grid, 3), random_outside_mask(grid, 9, seed), random_mask(n, n, 0.5, seed, 3)}) {
      const std::string what = case_label("masked weights", v, n, d, seed);
      Diagnostics cpu_diag, gpu_diag;
      MatD cpu;
      try {
        cpu = attention_weights<double>(v, q, k, 0.25, &mask, &cpu_diag);
      } catch (const NumericalError&) {
        continue;
      }
      const MatD gpu = gpu::attention_weights(v, q, k, 0.25, &mask, &gpu_diag);
      EXPECT_EQ(gpu_diag.degenerate_rows, cpu_diag.degenerate_rows) << what;
      const double worst = (gpu - cpu).cwiseAbs().maxCoeff();
      EXPECT_LE(worst, 1e-10 * (1.0 + cpu.cwiseAbs().maxCoeff())) << what;
    }
  }
}

TEST_F(CudaWeights, Float16CopiedAsFloat16GivesTheRowsOfItsWidenedValues) {
  // Half bits over the whole finite range that keeps logits moderate (|x| < 4, subnormals
  // included): the rows from the half copy equal, bit for bit, those from the floats the host
  // widens them to (half.hpp), since the same doubles reach the same products.
  for (auto [n, d] : {std::pair{1, 1}, {197, 64}, {63, 7}}) {
    std::vector<std::uint16_t> qh(static_cast<std::size_t>(n * d)), kh(qh.size());
    std::uint64_t state = 0x9e3779b97f4a7c15ULL * static_cast<std::uint64_t>(n + d);
    auto next = [&state] {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      const auto bits = static_cast<std::uint16_t>(state >> 48);
      return static_cast<std::uint16_t>((bits & 0x83ffU) | (((bits >> 10) % 17U) << 10));  // exponent <= 16
    };
    for (auto& x : qh) x = next();
    for (auto& x : kh) x = next();
    MatF q(n, d), k(n, d);
    for (int t = 0; t < n * d; ++t) {
      q.data()[t] = half_to_float(qh[static_cast<std::size_t>(t)]);
      k.data()[t] = half_to_float(kh[static_cast<std::size_t>(t)]);
    }
    cuda::Context& ctx = cuda::this_thread_context();
    MatD from_half(n, n), from_float(n, n);
    cuda::download_rows(ctx, cuda::softmax_rows_half(ctx, qh.data(), kh.data(), 1, n, d, 0.125), from_half.data());
    cuda::download_rows(ctx, cuda::softmax_rows(ctx, q.data(), k.data(), 1, n, d, 0.125), from_float.data());
    EXPECT_TRUE(from_half == from_float) << "N=" << n << " d=" << d << " max diff "
                                         << (from_half - from_float).cwiseAbs().maxCoeff();
  }
}

TEST_F(CudaWeights, PinnedInputsGiveTheRowsOfTheStagedCopy) {
  // A batch of heads written straight into pinned memory gives bit for bit the rows of the same
  // inputs copied through the staging area, on awkward sizes, and a smaller batch after a larger
  // one reuses the area (grow-only) without reading stale inputs.
  for (const auto& [batch, n, d] : {std::tuple{3, 197, 64}, std::tuple{5, 37, 7}, std::tuple{1, 2, 1}}) {
    std::vector<float> q(static_cast<std::size_t>(batch) * n * d), k(q.size());
    std::uint64_t state = 0x2545f4914f6cdd1dULL * static_cast<std::uint64_t>(batch + n + d);
    auto next = [&state] {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      return static_cast<float>(static_cast<double>(state >> 11) * 0x1.0p-53 * 8.0 - 4.0);
    };
    for (auto& x : q) x = next();
    for (auto& x : k) x = next();
    cuda::Context& ctx = cuda::this_thread_context();
    MatD staged(static_cast<Eigen::Index>(batch) * n, n), pinned(staged.rows(), n);
    cuda::download_rows(ctx, cuda::softmax_rows(ctx, q.data(), k.data(), batch, n, d, 0.125), staged.data());
    float* area = cuda::softmax_inputs(ctx, batch, n, d);
    std::copy(q.begin(), q.end(), area);
    std::copy(k.begin(), k.end(), area + q.size());
    cuda::download_rows(ctx, cuda::softmax_rows_pinned(ctx, batch, n, d, 0.125), pinned.data());
    EXPECT_TRUE(staged == pinned) << "batch=" << batch << " N=" << n << " d=" << d << " max diff "
                                  << (staged - pinned).cwiseAbs().maxCoeff();
    EXPECT_TRUE(staged.allFinite());
  }
}

TEST_F(CudaWeights, RowsLieWithinTheFilterBoundsOfTheExactRows) {
  for (const HeadCase& c : gpu_cases()) {
    std::unique_ptr<analyses::ExactRows> rows;
    try {
      rows = std::make_unique<analyses::ExactRows>(c.variant, c.q, c.k, c.scale);
    } catch (const NumericalError&) {
      continue;
    }
    const std::vector<double> bound = analyses::candidate_row_bounds(*rows, c.q, c.k, c.scale);
    const MatD gpu = analyses::confusion_rows_cuda(*rows, c.q, c.k, c.scale);
    for (int i = 0; i < rows->tokens(); ++i) {
      const double err = (gpu.row(i).transpose() - rows->row(i)).norm();
      EXPECT_FALSE(err > bound[static_cast<std::size_t>(i)])
          << c.label << " row " << i << " off by " << err << " > bound " << bound[static_cast<std::size_t>(i)];
    }
  }
}

}  // namespace
}  // namespace attnscope::test
