// The local term folded into the attention map (local_fold.hpp).
#include "attnscope/analyses/local_fold.hpp"

#include "attnscope/analyses/geometry_heads.hpp"
#include "attnscope/analyses/head_error.hpp"
#include "attnscope/error.hpp"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>

namespace attnscope::analyses {

namespace {

/// The grid a unit's convolution runs over: its height, width and first token (after the prefix).
struct ConvGrid {
  int height = 0, width = 0, first = 0;
};

ConvGrid conv_grid(const LayerGeometry& geo) {
  if (geo.reduced()) {
    throw UsageError(
        "the local term's kernel maps the layer's own tokens, and this layer's keys "
        "come from a reduced grid (" +
        geo.describe() + "): nothing to fold it into");
  }
  if (geo.windows > 0) return {geo.window_height, geo.window_width, 0};
  return {geo.grid.height, geo.grid.width, geo.grid.prefix};
}

/// Whether key j of unit u lies in the k x k window of query i (both on the grid).
bool in_window(const LayerGeometry& geo, int u, int i, int j, int window) {
  const auto [qr, qc] = geo.query_cell(u, i);
  const auto [kr, kc] = geo.key_cell(u, j);
  return qr >= 0 && kr >= 0 && std::abs(kr - qr) <= window / 2 && std::abs(kc - qc) <= window / 2;
}

void check_window(int window) {
  if (window < 1 || window % 2 == 0) {
    throw UsageError("--window must be a positive odd number, found " + std::to_string(window));
  }
}

}  // namespace

MatD depthwise_matrix(const MatD& kernel, int pad_height, int pad_width, int height, int width) {
  const int n = height * width;
  MatD m = MatD::Zero(n, n);
  for (int r = 0; r < height; ++r) {
    for (int c = 0; c < width; ++c) {
      for (int a = 0; a < kernel.rows(); ++a) {
        for (int b = 0; b < kernel.cols(); ++b) {
          const int sr = r + a - pad_height, sc = c + b - pad_width;
          if (sr < 0 || sr >= height || sc < 0 || sc >= width) continue;  // zero padding
          m(r * width + c, sr * width + sc) += kernel(a, b);
        }
      }
    }
  }
  return m;
}

MatD folded_unit_map(const MatD& w, const MatD& kernel, int pad_height, int pad_width,
                     const LayerGeometry& geo) {
  const ConvGrid g = conv_grid(geo);
  if (w.rows() != geo.unit_queries() || w.cols() != geo.unit_keys()) {
    throw UsageError("a unit map of " + std::to_string(w.rows()) + " x " +
                     std::to_string(w.cols()) + " is not of the layer's geometry (" +
                     geo.describe() + ")");
  }
  MatD out = w;
  const int n = g.height * g.width;
  out.block(g.first, g.first, n, n) +=
      depthwise_matrix(kernel, pad_height, pad_width, g.height, g.width);
  return out;
}

std::vector<double> folded_local_mass(const std::vector<double>& mass, const LocalKernel& kernel,
                                      int head, const LayerGeometry& geo, int window) {
  check_window(window);
  const ConvGrid g = conv_grid(geo);
  const int nq = geo.unit_queries();
  if (mass.size() != static_cast<std::size_t>(geo.query_rows())) {
    throw UsageError("folded_local_mass: " + std::to_string(mass.size()) +
                     " masses for a layer of " + std::to_string(geo.query_rows()) + " query rows");
  }
  std::vector<double> out = mass;
  for (int u = 0; u < geo.units(); ++u) {
    const MatD k = kernel.head_mean(head, u);
    for (int i = g.first; i < nq; ++i) {
      double& m = out[static_cast<std::size_t>(u) * nq + i];
      if (std::isnan(m)) continue;
      const int r = (i - g.first) / g.width, c = (i - g.first) % g.width;
      for (int a = 0; a < kernel.height; ++a) {
        for (int b = 0; b < kernel.width; ++b) {
          const int sr = r + a - kernel.pad_height, sc = c + b - kernel.pad_width;
          if (sr < 0 || sr >= g.height || sc < 0 || sc >= g.width) continue;
          if (in_window(geo, u, i, g.first + sr * g.width + sc, window)) m += k(a, b);
        }
      }
    }
  }
  return out;
}

std::vector<double> folded_local_mass_reference(const Variant& v, const MatF& q, const MatF& k,
                                                double scale, const LayerGeometry& geo,
                                                const LocalKernel& kernel, int head, int window,
                                                int* degenerate) {
  check_window(window);
  const int nq = geo.unit_queries(), nk = geo.unit_keys();
  std::vector<double> mass(static_cast<std::size_t>(geo.query_rows()),
                           std::numeric_limits<double>::quiet_NaN());
  int dead = 0;
  for (int u = 0; u < geo.units(); ++u) {
    const UnitRows rows = unit_rows(v, q, k, scale, geo, u);
    const MatD folded = folded_unit_map(rows.w, kernel.head_mean(head, u), kernel.pad_height,
                                        kernel.pad_width, geo);
    for (int i = 0; i < nq; ++i) {
      if (geo.query_cell(u, i).first < 0) continue;
      if (rows.degenerate[static_cast<std::size_t>(i)]) {
        ++dead;
        continue;
      }
      double s = 0.0;
      for (int j = 0; j < nk; ++j) {
        if (in_window(geo, u, i, j, window)) s += folded(i, j);
      }
      mass[static_cast<std::size_t>(u) * nq + i] = s;
    }
  }
  if (degenerate != nullptr) *degenerate = dead;
  return mass;
}

void require_local_kernels(const DumpSchema& schema, const std::vector<int>& layers) {
  const std::string& file = *schema.image_file(0).first;
  std::string with_kernel;
  for (int l = 0; l < schema.attrs.num_layers; ++l) {
    if (has_local_kernel(file, l) && !schema.geometry(l).reduced())
      with_kernel += (with_kernel.empty() ? "" : ",") + std::to_string(schema.model_layer(l));
  }
  for (int layer : layers) {
    const LayerGeometry geo = schema.geometry(layer);
    const bool has = has_local_kernel(file, layer);
    if (has && !geo.reduced()) {
      (void)read_local_kernel(file, layer, 0, geo);  // its shape and padding, before any run
      continue;
    }
    throw UsageError(
        "--fold-local: " + schema.path + ": model layer " +
        std::to_string(schema.model_layer(layer)) + " (" + geo.describe() + ") " +
        (has ? "has keys from a reduced grid, which its local term's kernel does not map"
             : "holds no local term's kernel (/layers/" + std::to_string(layer) +
                   "/local_kernel)") +
        "; layers with one: " +
        (with_kernel.empty() ? std::string("none") : "--layers " + with_kernel));
  }
}

FoldedLocality folded_locality(DumpReader& reader, const Selection& resolved,
                               const std::vector<Variant>& variants, int window, bool reference) {
  const DumpSchema& schema = reader.schema();
  require_local_kernels(schema, resolved.layers);
  // Every selected image's kernels, read here, on this thread (the loop's heads run in parallel).
  std::map<std::pair<int, int>, LocalKernel> kernels;  // (image, layer)
  for (int image : resolved.images) {
    const auto [file, index] = schema.image_file(image);
    for (int layer : resolved.layers)
      kernels[{image, layer}] = read_local_kernel(*file, layer, index, schema.geometry(layer));
  }
  const std::size_t nh = resolved.heads.size();
  std::vector<int> layer_slot(static_cast<std::size_t>(schema.attrs.num_layers), -1);
  std::vector<int> head_slot(static_cast<std::size_t>(schema.max_heads()), -1);
  for (std::size_t s = 0; s < resolved.layers.size(); ++s)
    layer_slot[resolved.layers[s]] = static_cast<int>(s);
  for (std::size_t s = 0; s < nh; ++s) head_slot[resolved.heads[s]] = static_cast<int>(s);
  FoldedLocality out;
  out.per_head.assign(variants.size(), std::vector<LocalityHead>(resolved.layers.size() * nh));
  for (auto& heads : out.per_head) {
    for (std::size_t s = 0; s < heads.size(); ++s) {
      heads[s].layer = resolved.layers[s / nh];
      heads[s].head = resolved.heads[s % nh];
    }
  }
  const std::vector<char> by_units = layers_by_units(schema, resolved.layers);
  const TokenGrid grid = schema.attrs.grid;
  // Each (layer, head) slot is written by one thread per image, so the slots need no lock.
  auto on_head = [&](const HeadView& hv) {
    const std::size_t s = static_cast<std::size_t>(layer_slot[hv.layer]) * nh +
                          static_cast<std::size_t>(head_slot[hv.head]);
    const LocalKernel& kernel = kernels.at({hv.image, hv.layer});
    for (std::size_t vi = 0; vi < variants.size(); ++vi) {
      int dead = 0;
      const Variant& v = head_variant(variants, vi, hv);
      const double sc = head_scale(hv, schema.attrs.scale);
      const std::vector<double> mass = in_head(hv.image, hv.layer, hv.head, [&] {
        if (reference) {
          return folded_local_mass_reference(v, hv.q, hv.k, sc, *hv.geometry, kernel, hv.head,
                                             window, &dead);
        }
        const std::vector<double> w_mass =
            by_units[static_cast<std::size_t>(hv.layer)]
                ? local_mass_units(v, hv.q, hv.k, sc, *hv.geometry, window, &dead)
                : local_mass(v, hv.q, hv.k, sc, grid, window, &dead);
        return folded_local_mass(w_mass, kernel, hv.head, *hv.geometry, window);
      });
      LocalityHead& h = out.per_head[vi][s];
      h.mass.merge(mass_stats(mass));
      h.degenerate_rows += dead;
    }
  };
  Selection without_v = resolved;
  without_v.need_v = false;
  without_v.any_geometry = true;
  for_each_head(reader, without_v, on_head, [&](int) { ++out.images; });
  return out;
}

}  // namespace attnscope::analyses
