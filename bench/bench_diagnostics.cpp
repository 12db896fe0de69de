// One DeiT-T head (197 tokens, d = 64, 14 x 14 grid + CLS, unit-variance q and k, s = 1/8) through
// the per-query diagnostics: `distance` and `entropy` on their fast path (float softmax rows, the
// head within the float range) and on the double path of a head outside it (q scaled by 8). Each
// benchmark first checks the fast result against the plain reference (within 1e-6, the tests'
// kMeasuredFloatTol), then times. Set beside bench_portable's Q K^T and exp rates, the numbers say
// how far the per-head cost is above the bound of one GEMM and one exp per weight.
#include "attnscope/analyses/distance.hpp"
#include "attnscope/analyses/entropy.hpp"

#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>

namespace {

using namespace attnscope;
using namespace attnscope::analyses;

const TokenGrid kGrid{1, 14, 14};
constexpr int kDim = 64;

MatF gaussian(std::uint64_t seed, float magnitude) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal;
  MatF m(kGrid.tokens(), kDim);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = magnitude * normal(gen);
  return m;
}

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "bench_diagnostics: %s\n", what);
  std::exit(1);
}

double worst(const std::vector<double>& a, const std::vector<double>& b) {
  double w = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!std::isnan(b[i])) w = std::max(w, std::abs(a[i] - b[i]) / std::max(1.0, std::abs(b[i])));
  return w;
}

/// magnitude 1: the float path; 8: the double path (logit error bound above 2^-12).
void BM_DistanceHead(benchmark::State& state) {
  const auto magnitude = static_cast<float>(state.range(0));
  const MatF q = gaussian(1, magnitude), k = gaussian(2, magnitude);
  const Variant v = parse_variant("softmax");
  const PatchGeometry geo(kGrid, 16.0, 16.0);
  const DistanceRows fast = attention_distance(v, q, k, 0.125, geo, {});
  if (worst(fast.distance, attention_distance_reference(v, q, k, 0.125, geo, {}).distance) > 1e-6)
    fail("distance: the fast path is off the reference");
  for (auto _ : state) benchmark::DoNotOptimize(attention_distance(v, q, k, 0.125, geo, {}));
}
BENCHMARK(BM_DistanceHead)->Arg(1)->Arg(8)->Unit(benchmark::kMicrosecond);

void BM_EntropyHead(benchmark::State& state) {
  const auto magnitude = static_cast<float>(state.range(0));
  const MatF q = gaussian(3, magnitude), k = gaussian(4, magnitude);
  const Variant v = parse_variant("softmax");
  const EntropyRows fast = attention_entropy(v, q, k, 0.125, {});
  if (worst(fast.entropy, attention_entropy_reference(v, q, k, 0.125, {}).entropy) > 1e-6)
    fail("entropy: the fast path is off the reference");
  for (auto _ : state) benchmark::DoNotOptimize(attention_entropy(v, q, k, 0.125, {}));
}
BENCHMARK(BM_EntropyHead)->Arg(1)->Arg(8)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
