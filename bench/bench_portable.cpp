// The portable kernels (portable_math.hpp) at DeiT-T's head shape: the Q K^T product in float and
// double, exp over a head's N x N logits, and the softmax float rows they make. The product's
// rate is the machine bound that docs/benchmarks.md quotes for confusion and locality (every
// head needs its Q K^T). Each benchmark first checks its result against a plain loop in the
// documented order (bit for bit) or against std::exp in long double (within 1 ulp), then times.
#include "attnscope/portable_math.hpp"
#include "attnscope/softmax.hpp"

#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

using namespace attnscope;

constexpr Eigen::Index kTokens = 197, kDim = 64;

template <typename T>
std::vector<T> gaussian(Eigen::Index n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (T& x : v) {
    double s = 0;  // sum of 12 uniforms minus 6: close enough to a normal for timing inputs
    for (int t = 0; t < 12; ++t) s += static_cast<double>(gen() >> 11) * 0x1.0p-53;
    x = static_cast<T>(s - 6.0);
  }
  return v;
}

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "bench_portable: %s\n", what);
  std::exit(1);
}

template <typename T>
void BM_GemmNtDeit(benchmark::State& state) {
  const std::vector<T> q = gaussian<T>(kTokens * kDim, 1), k = gaussian<T>(kTokens * kDim, 2);
  std::vector<T> c(static_cast<std::size_t>(kTokens * kTokens));
  portable::gemm_nt(q.data(), kDim, k.data(), kDim, c.data(), kTokens, kTokens, kTokens, kDim);
  for (Eigen::Index i = 0; i < kTokens; i += 13)
    for (Eigen::Index j = 0; j < kTokens; j += 7) {
      T s = T(0);
      for (Eigen::Index t = 0; t < kDim; ++t) s = std::fma(q[i * kDim + t], k[j * kDim + t], s);
      if (s != c[i * kTokens + j]) fail("gemm_nt differs from the plain loop");
    }
  for (auto _ : state) {
    portable::gemm_nt(q.data(), kDim, k.data(), kDim, c.data(), kTokens, kTokens, kTokens, kDim);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * kTokens * kTokens * kDim * static_cast<double>(state.iterations()) / 1e9,
                                                 benchmark::Counter::kIsRate);
}
BENCHMARK(BM_GemmNtDeit<float>)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GemmNtDeit<double>)->Unit(benchmark::kMicrosecond);

void BM_ExpFloatsDeit(benchmark::State& state) {
  const std::vector<float> x0 = gaussian<float>(kTokens * kTokens, 3);
  std::vector<float> x = x0;
  portable::exp_floats(x.data(), static_cast<Eigen::Index>(x.size()), 0.0F);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const long double want = std::exp(static_cast<long double>(x0[i]));
    const float ulp = std::nextafter(static_cast<float>(want), HUGE_VALF) - static_cast<float>(want);
    if (std::fabs(static_cast<long double>(x[i]) - want) > ulp) fail("exp_floats off by more than 1 ulp");
  }
  for (auto _ : state) {
    x = x0;
    portable::exp_floats(x.data(), static_cast<Eigen::Index>(x.size()), 0.0F);
    benchmark::DoNotOptimize(x.data());
  }
  state.counters["exp/s"] = benchmark::Counter(static_cast<double>(x.size() * state.iterations()),
                                               benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ExpFloatsDeit)->Unit(benchmark::kMicrosecond);

void BM_SoftmaxRowsFloatDeit(benchmark::State& state) {
  const std::vector<float> qv = gaussian<float>(kTokens * kDim, 4), kv = gaussian<float>(kTokens * kDim, 5);
  const MatF q = Eigen::Map<const MatF>(qv.data(), kTokens, kDim), k = Eigen::Map<const MatF>(kv.data(), kTokens, kDim);
  MatF w;
  softmax_rows_float(q, k, 0.125, w);
  if (std::fabs(w.row(0).cast<double>().sum() - 1.0) > 1e-5) fail("softmax rows do not sum to 1");
  for (auto _ : state) {
    softmax_rows_float(q, k, 0.125, w);
    benchmark::DoNotOptimize(w.data());
  }
}
BENCHMARK(BM_SoftmaxRowsFloatDeit)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
