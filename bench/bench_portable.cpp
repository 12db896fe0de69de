// The portable kernels (portable_math.hpp) at DeiT-T's head shape: the Q K^T product in float and
// double, exp over a head's N x N logits, and the softmax float rows they make. The product's
// rate is the machine bound that docs/benchmarks.md quotes for confusion and locality (every
// head needs its Q K^T); the product with its softmax step is the floor of a head that the
// side-by-side scripts measure in every run (bench/deit_floor.sh). Each benchmark first checks its
// result against a plain loop in the documented order (bit for bit) or against std::exp in long
// double (within 1 ulp), then times.
#include "attnscope/portable_math.hpp"
#include "attnscope/softmax.hpp"
#include "attnscope/attention_heads.hpp"

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

/// The dense layers of a DeiT-T block as replay runs them: 197 tokens x K times a packed K x N
/// float matrix (args: K, N): qkv (192, 576), proj (192, 192), fc1 (192, 768), fc2 (768, 192).
/// Also one head's Q K^T in float (64, 197: what the per-head diagnostics compute) and the double
/// products of one head's attention (64, 197: Q K^T; 197, 64: W V).
template <typename T>
void BM_GemmPacked(benchmark::State& state) {
  const Eigen::Index k = state.range(0), n = state.range(1);
  const std::vector<T> a = gaussian<T>(kTokens * k, 6), b = gaussian<T>(k * n, 7);
  std::vector<T> c(static_cast<std::size_t>(kTokens * n));
  portable::PackedMatrix<T> packed;
  packed.pack(b.data(), n, 1, k, n);
  portable::gemm_packed(a.data(), k, packed, c.data(), n, kTokens);
  for (Eigen::Index i = 0; i < kTokens; i += 11)
    for (Eigen::Index j = 0; j < n; j += 5) {
      T s = T(0);
      for (Eigen::Index t = 0; t < k; ++t) s = std::fma(a[i * k + t], b[t * n + j], s);
      if (s != c[i * n + j]) fail("gemm_packed differs from the plain loop");
    }
  for (auto _ : state) {
    portable::gemm_packed(a.data(), k, packed, c.data(), n, kTokens);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(kTokens * n * k) * static_cast<double>(state.iterations()) / 1e9,
                                                 benchmark::Counter::kIsRate);
}
BENCHMARK(BM_GemmPacked<float>)->Args({64, 197})->Args({192, 576})->Args({192, 192})->Args({192, 768})->Args({768, 192})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GemmPacked<double>)->Args({64, 197})->Args({197, 64})->Unit(benchmark::kMicrosecond);

/// The dense layers of DeiT-T's six blocks in turn (qkv, proj, fc1, fc2 of each: 7 MB of packed
/// weights, more than a core's L2), as one replay image runs them: the in-situ rate.
void BM_GemmPackedSixBlocks(benchmark::State& state) {
  const std::vector<float> a = gaussian<float>(kTokens * 768, 6);
  std::vector<float> c(static_cast<std::size_t>(kTokens * 768));
  const std::pair<Eigen::Index, Eigen::Index> shapes[4] = {{192, 576}, {192, 192}, {192, 768}, {768, 192}};
  std::vector<portable::PackedMatrix<float>> weights;
  for (int block = 0; block < 6; ++block)
    for (const auto& [k, n] : shapes) {
      const std::vector<float> b = gaussian<float>(k * n, static_cast<std::uint64_t>(10 + weights.size()));
      weights.emplace_back();
      weights.back().pack(b.data(), n, 1, k, n);
    }
  double flops = 0;
  for (const auto& w : weights) flops += 2.0 * static_cast<double>(kTokens * w.rows() * w.cols());
  for (auto _ : state) {
    for (const auto& w : weights) portable::gemm_packed(a.data(), w.rows(), w, c.data(), w.cols(), kTokens);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(flops * static_cast<double>(state.iterations()) / 1e9,
                                                 benchmark::Counter::kIsRate);
}
BENCHMARK(BM_GemmPackedSixBlocks)->Unit(benchmark::kMicrosecond);

void BM_ExpDoublesDeit(benchmark::State& state) {
  const std::vector<double> x0 = gaussian<double>(kTokens * kTokens, 3);
  std::vector<double> x = x0;
  portable::exp_doubles(x.data(), static_cast<Eigen::Index>(x.size()), 0.0);
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (x[i] != portable::exp(x0[i])) fail("exp_doubles differs from exp");
  }
  for (auto _ : state) {
    x = x0;
    portable::exp_doubles(x.data(), static_cast<Eigen::Index>(x.size()), 0.0);
    benchmark::DoNotOptimize(x.data());
  }
  state.counters["exp/s"] = benchmark::Counter(static_cast<double>(x.size() * state.iterations()),
                                               benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ExpDoublesDeit)->Unit(benchmark::kMicrosecond);

void BM_ExpDoubleScalarDeit(benchmark::State& state) {
  const std::vector<double> x0 = gaussian<double>(kTokens * kTokens, 3);
  std::vector<double> x = x0;
  for (auto _ : state) {
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = portable::exp(x0[i]);
    benchmark::DoNotOptimize(x.data());
  }
  state.counters["exp/s"] = benchmark::Counter(static_cast<double>(x.size() * state.iterations()),
                                               benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ExpDoubleScalarDeit)->Unit(benchmark::kMicrosecond);

/// erf over one DeiT-T block's GELU inputs (197 x 768, t / sqrt 2 for t normal with sd 1.05: about
/// 15% beyond 1, as in the trained models' MLPs): portable::erfs (replay's GELU) against glibc's
/// std::erf, which replay called before.
void BM_Erfs(benchmark::State& state) {
  std::vector<double> x = gaussian<double>(kTokens * 768, 8);
  for (double& v : x) v *= 0.75;
  std::vector<double> y(x.size());
  for (auto _ : state) {
    portable::erfs(x.data(), y.data(), static_cast<Eigen::Index>(x.size()));
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["erf/s"] = benchmark::Counter(static_cast<double>(x.size() * state.iterations()),
                                               benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Erfs)->Unit(benchmark::kMicrosecond);

void BM_StdErf(benchmark::State& state) {
  std::vector<double> x = gaussian<double>(kTokens * 768, 8);
  for (double& v : x) v *= 0.75;
  std::vector<double> y(x.size());
  for (auto _ : state) {
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = std::erf(x[i]);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["erf/s"] = benchmark::Counter(static_cast<double>(x.size() * state.iterations()),
                                               benchmark::Counter::kIsRate);
}
BENCHMARK(BM_StdErf)->Unit(benchmark::kMicrosecond);

/// One DeiT-T softmax head's outputs in double as replay computes them: q, k, v the head's
/// columns of a 197 x 576 qkv matrix. softmax_head_outputs (the fast path) against the library's
/// attention_outputs (the plain one; the same bits).
template <bool kFast>
void BM_SoftmaxHeadOutputs(benchmark::State& state) {
  const std::vector<double> qkv = gaussian<double>(kTokens * 3 * 192, 9);
  const Eigen::Index ld = 3 * 192;
  std::vector<double> out(static_cast<std::size_t>(kTokens * kDim));
  using Strided = Eigen::Map<const MatD, 0, Eigen::OuterStride<>>;
  const Strided q(qkv.data(), kTokens, kDim, Eigen::OuterStride<>(ld)), k(qkv.data() + 192, kTokens, kDim, Eigen::OuterStride<>(ld)),
      v(qkv.data() + 384, kTokens, kDim, Eigen::OuterStride<>(ld));
  const Variant softmax = parse_variant("softmax", Convention::Code);
  const MatD want = attention_outputs<double>(softmax, q, k, v, 0.125);
  softmax_head_outputs(qkv.data(), ld, kTokens, qkv.data() + 192, ld, qkv.data() + 384, ld, kTokens, kDim, kDim, 0.125,
                       nullptr, out.data(), kDim);
  for (Eigen::Index i = 0; i < kTokens * kDim; ++i) {
    if (out[static_cast<std::size_t>(i)] != want.data()[i]) fail("softmax_head_outputs differs from attention_outputs");
  }
  for (auto _ : state) {
    if constexpr (kFast) {
      softmax_head_outputs(qkv.data(), ld, kTokens, qkv.data() + 192, ld, qkv.data() + 384, ld, kTokens, kDim, kDim,
                           0.125, nullptr, out.data(), kDim);
      benchmark::DoNotOptimize(out.data());
    } else {
      MatD o = attention_outputs<double>(softmax, q, k, v, 0.125);
      benchmark::DoNotOptimize(o.data());
    }
  }
}
BENCHMARK(BM_SoftmaxHeadOutputs<true>)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SoftmaxHeadOutputs<false>)->Unit(benchmark::kMicrosecond);

/// The same head in float (replay --attention float), against the double head above: outputs
/// within 1e-5 of the largest |output| of the double ones (checked before timing).
void BM_SoftmaxHeadOutputsFloat(benchmark::State& state) {
  const std::vector<double> qkv = gaussian<double>(kTokens * 3 * 192, 9);
  const Eigen::Index ld = 3 * 192;
  std::vector<double> want(static_cast<std::size_t>(kTokens * kDim)), out(want.size());
  softmax_head_outputs(qkv.data(), ld, kTokens, qkv.data() + 192, ld, qkv.data() + 384, ld, kTokens, kDim, kDim, 0.125,
                       nullptr, want.data(), kDim);
  if (!softmax_head_outputs_float(qkv.data(), ld, kTokens, qkv.data() + 192, ld, qkv.data() + 384, ld, kTokens, kDim,
                                  kDim, 0.125, out.data(), kDim)) {
    fail("softmax_head_outputs_float refused finite inputs");
  }
  double top = 0, worst = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    top = std::max(top, std::fabs(want[i]));
    worst = std::max(worst, std::fabs(out[i] - want[i]));
  }
  if (worst > 1e-5 * top) fail("softmax_head_outputs_float is off the double head by more than 1e-5");
  for (auto _ : state) {
    benchmark::DoNotOptimize(softmax_head_outputs_float(qkv.data(), ld, kTokens, qkv.data() + 192, ld,
                                                        qkv.data() + 384, ld, kTokens, kDim, kDim, 0.125, out.data(),
                                                        kDim));
    benchmark::DoNotOptimize(out.data());
  }
}
BENCHMARK(BM_SoftmaxHeadOutputsFloat)->Unit(benchmark::kMicrosecond);

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

/// The step on kTokens rows of kTokens: checked (max_scaled, then exp_floats_sums) or not (softmax_exps).
template <bool Checked>
void softmax_step(std::vector<float>& x, std::vector<float>& tops, std::vector<double>& sums, float s) {
  if constexpr (Checked) {
    for (Eigen::Index r = 0; r < kTokens; ++r) tops[static_cast<std::size_t>(r)] = portable::max_scaled(x.data() + r * kTokens, kTokens, s);
    portable::exp_floats_sums(x.data(), kTokens, kTokens, kTokens, s, tops.data(), sums.data());
  } else {
    portable::softmax_exps(x.data(), kTokens, kTokens, kTokens, s, tops.data(), sums.data());
  }
}

// The softmax step of one DeiT-T head's float logits (197 rows of 197, scaled by 1/8): the rows'
// maxima, then the exponentials and their sums. Checked: max_scaled then exp_floats_sums, which
// checks every argument for its fallback; <false>: softmax_exps, which needs no check (the same
// bits, compared before timing). Each iteration starts from the same logits.
template <bool Checked>
void BM_SoftmaxStepDeit(benchmark::State& state) {
  const std::vector<float> x0 = gaussian<float>(kTokens * kTokens, 3);
  std::vector<float> x = x0, tops(kTokens);
  std::vector<double> sums(kTokens);
  const float s = 0.125F;
  softmax_step<Checked>(x, tops, sums, s);
  std::vector<float> other = x0, other_tops(kTokens);
  std::vector<double> other_sums(kTokens);
  softmax_step<!Checked>(other, other_tops, other_sums, s);
  if (x != other || sums != other_sums) fail("softmax_exps and max_scaled + exp_floats_sums differ");
  for (auto _ : state) {
    std::copy(x0.begin(), x0.end(), x.begin());
    softmax_step<Checked>(x, tops, sums, s);
    benchmark::DoNotOptimize(x.data());
  }
}
BENCHMARK(BM_SoftmaxStepDeit<true>)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SoftmaxStepDeit<false>)->Unit(benchmark::kMicrosecond);

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

// The floor of a DeiT-T softmax head (bench/deit_floor.sh): the float Q K^T product with the keys
// already packed, then the softmax step on it in place (the rows' maxima, one exponential per
// weight, the row sums), nothing else: what a command that computes every weight cannot skip.
// Checked first: each row's exponentials over their sum are softmax_rows_float's weights.
void BM_ProductAndStepDeit(benchmark::State& state) {
  const std::vector<float> qv = gaussian<float>(kTokens * kDim, 4), kv = gaussian<float>(kTokens * kDim, 5);
  portable::PackedMatrix<float> keys;
  keys.pack(kv.data(), 1, kDim, kDim, kTokens);  // K^T: entry (t, j) is k_j's t-th
  std::vector<float> c(static_cast<std::size_t>(kTokens * kTokens)), tops(kTokens);
  std::vector<double> sums(kTokens);
  const auto step = [&] {
    portable::gemm_packed(qv.data(), kDim, keys, c.data(), kTokens, kTokens);
    return portable::softmax_exps(c.data(), kTokens, kTokens, kTokens, 0.125F, tops.data(), sums.data());
  };
  if (!step()) fail("the product and step's rows are not finite");
  const MatF q = Eigen::Map<const MatF>(qv.data(), kTokens, kDim), k = Eigen::Map<const MatF>(kv.data(), kTokens, kDim);
  MatF w;
  softmax_rows_float(q, k, 0.125, w);
  for (Eigen::Index i = 0; i < kTokens; ++i)
    for (Eigen::Index j = 0; j < kTokens; ++j) {
      const double mine = static_cast<double>(c[static_cast<std::size_t>(i * kTokens + j)]) / sums[static_cast<std::size_t>(i)];
      if (std::fabs(mine - static_cast<double>(w(i, j))) > 1e-6) fail("the product and step differ from softmax_rows_float");
    }
  for (auto _ : state) {
    benchmark::DoNotOptimize(step());
    benchmark::DoNotOptimize(c.data());
  }
}
BENCHMARK(BM_ProductAndStepDeit)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
