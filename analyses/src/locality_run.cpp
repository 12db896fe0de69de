// Streaming driver of the local-mass analysis: per (variant, layer, head) statistics over images
// and grid queries, memory independent of the number of images.
#include "attnscope/analyses/locality.hpp"

#include "attnscope/analyses/cuda_paths.hpp"
#include "attnscope/analyses/head_error.hpp"

#include <cmath>

namespace attnscope::analyses {

LocalityResult run_locality(DumpReader& reader, const Selection& resolved,
                            const std::vector<Variant>& variants, int window, bool reference,
                            const std::function<void(int)>& on_image, Device device) {
  const DumpSchema& schema = reader.schema();
  const TokenGrid grid = schema.attrs.grid;
  const double scale = schema.attrs.scale;
  const std::size_t nh = resolved.heads.size();
  LocalityResult res;
  res.variants = variants;
  res.window = window;
  res.uniform_baseline = uniform_baseline(grid, window);
  res.per_head.assign(variants.size(), std::vector<LocalityHead>(resolved.layers.size() * nh));
  for (auto& heads : res.per_head) {
    for (std::size_t s = 0; s < heads.size(); ++s) {
      heads[s].layer = resolved.layers[s / nh];
      heads[s].head = resolved.heads[s % nh];
    }
  }
  std::vector<int> layer_slot(static_cast<std::size_t>(schema.attrs.num_layers), -1);
  std::vector<int> head_slot(static_cast<std::size_t>(schema.attrs.num_heads), -1);
  for (std::size_t s = 0; s < resolved.layers.size(); ++s) layer_slot[resolved.layers[s]] = static_cast<int>(s);
  for (std::size_t s = 0; s < nh; ++s) head_slot[resolved.heads[s]] = static_cast<int>(s);

  // Each (layer, head) slot is touched by one thread per image and images run in order, so the
  // per-slot accumulators need no lock.
  auto on_head = [&](const HeadView& hv) {
    const std::size_t s = static_cast<std::size_t>(layer_slot[hv.layer]) * nh +
                          static_cast<std::size_t>(head_slot[hv.head]);
    for (std::size_t vi = 0; vi < variants.size(); ++vi) {
      int dead = 0;
      const std::vector<double> mass = in_head(hv.image, hv.layer, hv.head, [&] {
        if (reference) return local_mass_reference(variants[vi], hv.q, hv.k, scale, grid, window, &dead);
        if (device == Device::Cuda) return local_mass_cuda(variants[vi], hv.q, hv.k, scale, grid, window, &dead);
        return local_mass(variants[vi], hv.q, hv.k, scale, grid, window, &dead);
      });
      RunningStats image_stats;
      for (double m : mass) {
        if (!std::isnan(m)) image_stats.add(m);
      }
      LocalityHead& h = res.per_head[vi][s];
      h.mass.merge(image_stats);
      h.degenerate_rows += dead;
    }
  };
  auto done = [&](int image) {
    ++res.images;
    if (on_image) on_image(image);
  };
  Selection without_v = resolved;  // locality looks at attention weights only: V is not read
  without_v.need_v = false;
  for_each_head(reader, without_v, on_head, done);
  return res;
}

}  // namespace attnscope::analyses
