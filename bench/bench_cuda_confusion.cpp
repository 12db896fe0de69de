// Confusion counting of whole images on the GPU, in batches of images (count_confusion_cuda_batch:
// all heads of the batch in one launch), against the CPU's per-head count on one thread, DeiT-T
// shape (12 layers x 3 heads, 197 tokens, head dim 64, planted pairs). Each benchmark first checks
// that the GPU's counts equal the CPU's, head by head, then times; items are images. Without a
// CUDA device (or CUDA) the GPU benchmarks stop with the reason.
#include "attnscope/analyses/confusion.hpp"
#include "attnscope/device.hpp"
#include "attnscope/synth.hpp"

#include <benchmark/benchmark.h>

#include <string>
#include <vector>

namespace {

using namespace attnscope;

struct Images {
  std::vector<ImageQKV> images;
  std::vector<analyses::HeadInput> heads;
  double scale = 0.0;
};

Images deit_images(int count) {
  SynthOptions o;
  o.layers = 12;
  o.heads = 3;
  o.grid = TokenGrid{1, 14, 14};
  o.head_dim = 64;
  o.images = count;
  o.seed = 5;
  o.plant_duplicates = 1;
  o.plant_collinear = 1;
  o.plant_shifted = 1;
  o.plant_hyperplane = true;
  Images out;
  out.scale = o.scale();
  for (int i = 0; i < count; ++i) out.images.push_back(synth_image(o, i));
  for (const ImageQKV& img : out.images) {
    for (int l = 0; l < o.layers; ++l) {
      for (int h = 0; h < o.heads; ++h) out.heads.push_back({&img.Q(l, h), &img.Q(l, h), &img.K(l, h)});
    }
  }
  return out;
}

void BM_ConfusionGpuBatch(benchmark::State& state) {
  std::string why;
  if (!cuda_device_available(&why)) {
    state.SkipWithError(("no CUDA device: " + why).c_str());
    return;
  }
  const Images data = deit_images(static_cast<int>(state.range(0)));
  const Variant v = parse_variant("softmax");
  const analyses::ConfusionOptions opt;
  const auto gpu = analyses::count_confusion_cuda_batch(v, data.heads, data.scale, opt);
  for (std::size_t h = 0; h < data.heads.size(); ++h) {
    const auto cpu = analyses::count_confusion(v, *data.heads[h].q, *data.heads[h].q_raw, *data.heads[h].k,
                                               data.scale, opt);
    if (cpu.pairs != gpu[h].pairs) {
      state.SkipWithError(("head " + std::to_string(h) + ": GPU count " + std::to_string(gpu[h].pairs) +
                           " != CPU count " + std::to_string(cpu.pairs))
                              .c_str());
      return;
    }
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(analyses::count_confusion_cuda_batch(v, data.heads, data.scale, opt));
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
  state.SetLabel(resolve_device(Device::Auto, "confusion").description);
}
BENCHMARK(BM_ConfusionGpuBatch)->Arg(1)->Arg(8)->Arg(32)->Arg(128)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_ConfusionCpuOneThread(benchmark::State& state) {
  const Images data = deit_images(static_cast<int>(state.range(0)));
  const Variant v = parse_variant("softmax");
  const analyses::ConfusionOptions opt;
  for (auto _ : state) {
    std::int64_t pairs = 0;
    for (const auto& h : data.heads) pairs += analyses::count_confusion(v, *h.q, *h.q_raw, *h.k, data.scale, opt).pairs;
    benchmark::DoNotOptimize(pairs);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_ConfusionCpuOneThread)->Arg(1)->Arg(8)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
