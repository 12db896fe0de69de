// Linear-time forms (InLine eq. 5, MALA eq. 13) against the explicit N x N weights times V, over N
// from DeiT-T's 197 tokens to Swin stage 1's 3136 and beyond. Each size first checks that the two
// forms agree (float, against the explicit form), then times; the complexity fit of Google
// Benchmark reports the exponent of N.
#include "attnscope/attention.hpp"

#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>

namespace {

using namespace attnscope;

constexpr int kDim = 64;

MatF gaussian(int rows, int cols, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  MatF m(rows, cols);
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) {
      // Sum of 12 uniforms minus 6: close enough to a standard normal for timing inputs.
      double s = 0;
      for (int t = 0; t < 12; ++t) s += static_cast<double>(gen() >> 11) * 0x1.0p-53;
      m(i, j) = static_cast<float>(s - 6.0);
    }
  }
  return m;
}

struct Inputs {
  MatF q, k, v;
  double scale;
};

Inputs inputs(int n) {
  return {gaussian(n, kDim, 1), gaussian(n, kDim, 2), gaussian(n, kDim, 3),
          1.0 / std::sqrt(static_cast<double>(kDim))};
}

/// Aborts when the two forms disagree beyond float rounding (relative to max |explicit|).
void check_forms_agree(const Variant& v, const Inputs& in) {
  const MatF fast = attention_outputs<float>(v, in.q, in.k, in.v, in.scale);
  const MatF slow = attention_outputs_explicit<float>(v, in.q, in.k, in.v, in.scale);
  const double scale = std::max(1.0, static_cast<double>(slow.cwiseAbs().maxCoeff()));
  const double err = static_cast<double>((fast - slow).cwiseAbs().maxCoeff()) / scale;
  if (!(err <= 1e-3)) {
    std::fprintf(stderr, "%s N=%ld: linear-time and explicit forms differ by %g\n",
                 v.name().c_str(), static_cast<long>(in.q.rows()), err);
    std::abort();
  }
}

void run(benchmark::State& state, const char* spec, bool linear_time) {
  const Variant v = parse_variant(spec);
  const Inputs in = inputs(static_cast<int>(state.range(0)));
  check_forms_agree(v, in);
  for (auto _ : state) {
    MatF out = linear_time ? attention_outputs<float>(v, in.q, in.k, in.v, in.scale)
                           : attention_outputs_explicit<float>(v, in.q, in.k, in.v, in.scale);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetComplexityN(state.range(0));
}

/// The linear-time form written into a caller's buffer: with the thread's scratch kept between
/// calls, a run of calls of one size allocates nothing at all.
void run_into(benchmark::State& state, const char* spec) {
  const Variant v = parse_variant(spec);
  const Inputs in = inputs(static_cast<int>(state.range(0)));
  check_forms_agree(v, in);
  MatF out(in.q.rows(), in.v.cols());
  for (auto _ : state) {
    attention_outputs_into<float>(v, in.q, in.k, in.v, in.scale, out);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
}

void args(benchmark::internal::Benchmark* b) {
  for (int n : {197, 512, 1024, 2048, 3136, 4096}) b->Arg(n);
  b->Complexity(benchmark::oAuto)->Unit(benchmark::kMicrosecond);
}

/// Sizes around malloc's mmap threshold (128 KiB: one N x 64 double buffer at N = 256), where a
/// form that allocates its buffers on every call pays for fresh pages each time.
void small_args(benchmark::internal::Benchmark* b) {
  for (int n : {64, 128, 256, 512}) b->Arg(n);
  b->Unit(benchmark::kMicrosecond);
}

BENCHMARK_CAPTURE(run, inline_code_linear_time_small, "inline@code", true)->Apply(small_args);
BENCHMARK_CAPTURE(run, mala_code_linear_time_small, "mala@code", true)->Apply(small_args);
BENCHMARK_CAPTURE(run_into, inline_code_linear_time_into_small, "inline@code")->Apply(small_args);
BENCHMARK_CAPTURE(run_into, mala_code_linear_time_into_small, "mala@code")->Apply(small_args);
BENCHMARK_CAPTURE(run, inline_code_linear_time, "inline@code", true)->Apply(args);
BENCHMARK_CAPTURE(run, inline_code_explicit, "inline@code", false)->Apply(args);
BENCHMARK_CAPTURE(run, mala_code_linear_time, "mala@code", true)->Apply(args);
BENCHMARK_CAPTURE(run, mala_code_explicit, "mala@code", false)->Apply(args);

}  // namespace

BENCHMARK_MAIN();
