// Per-head confusion counting: the fast search against the brute force, DeiT-T and Swin stage-1
// shapes. Each benchmark first checks that the fast count equals the reference, then times.
#include "attnscope/analyses/confusion.hpp"
#include "attnscope/synth.hpp"

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>

namespace {

using namespace attnscope;

struct Head {
  MatF q, k;
  double scale;
};

Head synth_head(int prefix, int side, int d) {
  SynthOptions o;
  o.layers = 1;
  o.heads = 1;
  o.grid = TokenGrid{prefix, side, side};
  o.head_dim = d;
  o.images = 1;
  o.seed = 3;
  o.plant_collinear = 2;
  o.plant_shifted = 1;
  o.plant_hyperplane = true;
  const ImageQKV img = synth_image(o, 0);
  return {img.Q(0, 0), img.K(0, 0), o.scale()};
}

const Head& deit() {
  static const Head h = synth_head(1, 14, 64);
  return h;
}
const Head& swin() {
  static const Head h = synth_head(0, 56, 32);
  return h;
}

void check(const Variant& v, const Head& h, bool with_reference) {
  if (!with_reference) return;
  const analyses::ConfusionOptions opt;
  const auto fast = analyses::count_confusion(v, h.q, h.q, h.k, h.scale, opt);
  const auto ref = analyses::count_confusion_reference(v, h.q, h.q, h.k, h.scale, opt);
  if (fast.pairs != ref.pairs) {
    std::fprintf(stderr, "%s: fast %lld != reference %lld\n", v.name().c_str(),
                 static_cast<long long>(fast.pairs), static_cast<long long>(ref.pairs));
    std::abort();
  }
}

void run(benchmark::State& state, const char* spec, const Head& h, bool reference, bool check_first) {
  const Variant v = parse_variant(spec);
  check(v, h, check_first);
  const analyses::ConfusionOptions opt;
  std::int64_t pairs = 0;
  for (auto _ : state) {
    const auto r = reference ? analyses::count_confusion_reference(v, h.q, h.q, h.k, h.scale, opt)
                             : analyses::count_confusion(v, h.q, h.q, h.k, h.scale, opt);
    pairs = r.pairs;
    benchmark::DoNotOptimize(pairs);
  }
  state.counters["pairs"] = static_cast<double>(pairs);
}

void BM_DeitSoftmaxFast(benchmark::State& s) { run(s, "softmax", deit(), false, true); }
void BM_DeitSoftmaxReference(benchmark::State& s) { run(s, "softmax", deit(), true, false); }
void BM_DeitLinearReluFast(benchmark::State& s) { run(s, "linear:relu", deit(), false, true); }
void BM_DeitInlineFast(benchmark::State& s) { run(s, "inline", deit(), false, true); }
void BM_SwinLinearReluFast(benchmark::State& s) { run(s, "linear:relu", swin(), false, false); }
void BM_SwinInlineFast(benchmark::State& s) { run(s, "inline", swin(), false, false); }
void BM_SwinMalaFast(benchmark::State& s) { run(s, "mala", swin(), false, false); }
void BM_SwinSoftmaxFast(benchmark::State& s) { run(s, "softmax", swin(), false, false); }

BENCHMARK(BM_DeitSoftmaxFast)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DeitSoftmaxReference)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DeitLinearReluFast)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DeitInlineFast)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SwinLinearReluFast)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SwinInlineFast)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SwinMalaFast)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SwinSoftmaxFast)->Unit(benchmark::kMillisecond);

// Per-head timings are single-threaded: Eigen's own OpenMP parallelism on these small products only
// adds synchronisation (the app calls them from inside its parallel loop, where Eigen runs serially).
const bool kSerialEigen = [] {
  Eigen::setNbThreads(1);
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
