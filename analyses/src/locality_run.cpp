// Streaming driver of the local-mass analysis: per image, per (variant, layer, head) statistics
// over the image's grid queries, folded over images in order; memory independent of the number
// of images.
#include "attnscope/analyses/locality.hpp"

#include "attnscope/analyses/geometry_heads.hpp"
#include "attnscope/analyses/head_error.hpp"
#include "attnscope/error.hpp"

#include <cmath>

namespace attnscope::analyses {

namespace {

/// Per (variant, slot) heads labelled with their layer and head, statistics empty.
std::vector<std::vector<LocalityHead>> labelled_heads(std::size_t variants, const Selection& resolved) {
  const std::size_t nh = resolved.heads.size();
  std::vector<std::vector<LocalityHead>> out(variants,
                                             std::vector<LocalityHead>(resolved.layers.size() * nh));
  for (auto& heads : out) {
    for (std::size_t s = 0; s < heads.size(); ++s) {
      heads[s].layer = resolved.layers[s / nh];
      heads[s].head = resolved.heads[s % nh];
    }
  }
  return out;
}

}  // namespace

RunningStats mass_stats(const std::vector<double>& mass) {
  RunningStats s;
  for (double m : mass) {
    if (!std::isnan(m)) s.add(m);
  }
  return s;
}

LocalityTotals::LocalityTotals(const std::vector<Variant>& variants, const Selection& resolved,
                               const TokenGrid& grid, int window) {
  res_.variants = variants;
  res_.window = window;
  res_.uniform_baseline = uniform_baseline(grid, window);
  res_.per_head = labelled_heads(variants.size(), resolved);
}

void LocalityTotals::add(const LocalityImage& img) {
  if (img.heads.size() != res_.per_head.size()) {
    throw Error("locality: image " + std::to_string(img.image) + "'s part does not match the variants");
  }
  for (std::size_t vi = 0; vi < img.heads.size(); ++vi) {
    if (img.heads[vi].size() != res_.per_head[vi].size()) {
      throw Error("locality: image " + std::to_string(img.image) +
                  "'s part does not match the selection's heads");
    }
    for (std::size_t s = 0; s < img.heads[vi].size(); ++s) {
      LocalityHead& h = res_.per_head[vi][s];
      h.mass.merge(img.heads[vi][s].mass);
      h.degenerate_rows += img.heads[vi][s].degenerate_rows;
    }
  }
  ++res_.images;
}

void locality_images(DumpReader& reader, const Selection& resolved,
                     const std::vector<Variant>& variants, int window, bool reference,
                     const std::function<void(LocalityImage&&)>& sink, Device device) {
  const DumpSchema& schema = reader.schema();
  const TokenGrid grid = schema.attrs.grid;
  const double scale = schema.attrs.scale;
  const std::size_t nh = resolved.heads.size();
  std::vector<int> layer_slot(static_cast<std::size_t>(schema.attrs.num_layers), -1);
  std::vector<int> head_slot(static_cast<std::size_t>(schema.max_heads()), -1);
  for (std::size_t s = 0; s < resolved.layers.size(); ++s) layer_slot[resolved.layers[s]] = static_cast<int>(s);
  for (std::size_t s = 0; s < nh; ++s) head_slot[resolved.heads[s]] = static_cast<int>(s);

  const std::vector<char> by_units = layers_by_units(schema, resolved.layers);
  for (int layer : resolved.layers) {
    if (by_units[static_cast<std::size_t>(layer)] && device == Device::Cuda && !reference) {
      throw UsageError("locality --device cuda: " + schema.path + ": model layer " +
                       std::to_string(schema.model_layer(layer)) + " (" +
                       schema.geometry(layer).describe() +
                       ") is measured window by window on the CPU only; run with --device cpu");
    }
  }
  // Per image in flight, its lane's slots; each (layer, head) slot is written by one thread, so
  // the slots need no lock.
  std::vector<LocalityImage> current(kImagesInFlight);
  for (LocalityImage& c : current) c.heads = labelled_heads(variants.size(), resolved);
  auto on_head = [&](const HeadView& hv, std::size_t lane) {
    const std::size_t s = static_cast<std::size_t>(layer_slot[hv.layer]) * nh +
                          static_cast<std::size_t>(head_slot[hv.head]);
    for (std::size_t vi = 0; vi < variants.size(); ++vi) {
      int dead = 0;
      const Variant& v = head_variant(variants, vi, hv);
      const double sc = head_scale(hv, scale);
      const std::vector<double> mass = in_head(hv.image, hv.layer, hv.head, [&] {
        if (by_units[static_cast<std::size_t>(hv.layer)]) {
          return local_mass_units(v, hv.q, hv.k, sc, *hv.geometry, window, &dead);
        }
        if (reference) return local_mass_reference(v, hv.q, hv.k, sc, grid, window, &dead);
        if (device == Device::Cuda) return local_mass_cuda(v, hv.q, hv.k, sc, grid, window, &dead);
        return local_mass(v, hv.q, hv.k, sc, grid, window, &dead);
      });
      LocalityHead& h = current[lane].heads[vi][s];
      h.mass = mass_stats(mass);
      h.degenerate_rows = dead;
    }
  };
  auto on_image = [&](int image, std::size_t lane) {
    LocalityImage done;
    done.image = image;
    done.heads = current[lane].heads;
    sink(std::move(done));
  };
  Selection without_v = resolved;  // locality looks at attention weights only: V is not read
  without_v.need_v = false;
  without_v.any_geometry = true;  // layers of another geometry: unit by unit
  for_each_head_pipelined(reader, without_v, kImagesInFlight, on_head, on_image);
}

LocalityResult run_locality(DumpReader& reader, const Selection& resolved,
                            const std::vector<Variant>& variants, int window, bool reference,
                            const std::function<void(int)>& on_image, Device device) {
  LocalityTotals totals(variants, resolved, reader.schema().attrs.grid, window);
  locality_images(
      reader, resolved, variants, window, reference,
      [&](LocalityImage&& img) {
        totals.add(img);
        if (on_image) on_image(img.image);
      },
      device);
  return totals.result();
}

}  // namespace attnscope::analyses
