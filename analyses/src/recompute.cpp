// Recomputation check against the model's own tensors (recompute.hpp).
#include "attnscope/analyses/recompute.hpp"

#include "attnscope/analyses/head_error.hpp"
#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"
#include "attnscope/parallel.hpp"

#include <algorithm>
#include <optional>

namespace attnscope::analyses {
namespace {

// Largest |x| with a floor, so that a head whose tensor is all zeros still gives a finite ratio.
double magnitude(const MatF& m) {
  return std::max(static_cast<double>(m.cwiseAbs().maxCoeff()), 1e-30);
}

void compare_head_in(const Variant& variant, const MatF& q, const MatF& k, const MatF& v,
                     double scale, const MatF* out_model, const MatF* attn_model,
                     RecomputeCell& cell) {
  const MatD qd = q.cast<double>(), kd = k.cast<double>(), vd = v.cast<double>();
  Diagnostics diag;
  ++cell.images;
  if (out_model) {
    const MatD out = attention_outputs<double>(variant, qd, kd, vd, scale, nullptr, &diag);
    const MatD err = (out - out_model->cast<double>()).cwiseAbs();
    cell.has_out = true;
    cell.out_max_abs = std::max(cell.out_max_abs, err.maxCoeff());
    cell.out_max_rel = std::max(cell.out_max_rel, err.maxCoeff() / magnitude(*out_model));
    cell.out_sum_abs += err.sum();
    cell.out_values += err.size();
    cell.degenerate_rows += static_cast<long long>(diag.degenerate_rows.size());
  }
  if (attn_model) {
    const MatD w = attention_weights<double>(variant, qd, kd, scale, nullptr, &diag);
    cell.has_attn = true;
    cell.attn_max_abs =
        std::max(cell.attn_max_abs, (w - attn_model->cast<double>()).cwiseAbs().maxCoeff());
  }
}

}  // namespace

void compare_head(const Variant& variant, const MatF& q, const MatF& k, const MatF& v,
                  double scale, const MatF* out_model, const MatF* attn_model,
                  RecomputeCell& cell) {
  in_head(-1, cell.layer, cell.head, [&] {
    compare_head_in(variant, q, k, v, scale, out_model, attn_model, cell);
  });
}

std::vector<RecomputeCell> recompute_dump(DumpReader& reader, const Variant& variant,
                                          const std::vector<int>& images_in) {
  const DumpSchema& s = reader.schema();
  const int layers = s.attrs.num_layers, heads = s.attrs.num_heads;
  bool any = false;
  for (int l = 0; l < layers; ++l) any = any || s.layer_has_out[l] || s.layer_has_attn[l];
  if (!any) {
    throw InputError(s.path, "/layers/*/out", "the model's own outputs ('out') or weights ('attn')",
                     "neither in any layer");
  }
  std::vector<int> images = images_in;
  if (images.empty()) {
    for (int i = 0; i < s.num_images; ++i) images.push_back(i);
  }
  std::vector<RecomputeCell> cells(static_cast<std::size_t>(layers * heads));
  for (int l = 0; l < layers; ++l)
    for (int h = 0; h < heads; ++h) {
      cells[static_cast<std::size_t>(l * heads + h)].layer = l;
      cells[static_cast<std::size_t>(l * heads + h)].head = h;
    }
  const std::size_t n_heads = cells.size();
  for (int image : images) {
    const ImageQKV img = reader.read_image(image);
    // HDF5 is read on this thread only; the comparisons run in parallel.
    std::vector<std::optional<MatF>> out(n_heads), attn(n_heads);
    for (int l = 0; l < layers; ++l)
      for (int h = 0; h < heads; ++h) {
        const auto idx = static_cast<std::size_t>(l * heads + h);
        if (s.layer_has_out[l]) out[idx] = reader.read_out(image, l, h);
        if (s.layer_has_attn[l]) attn[idx] = reader.read_attn(image, l, h);
      }
    parallel_for(static_cast<int>(n_heads), [&](int idx) {
      const int l = idx / heads, h = idx % heads;
      const auto u = static_cast<std::size_t>(idx);
      compare_head(variant, img.Q(l, h), img.K(l, h), img.V(l, h), s.attrs.scale,
                   out[u] ? &*out[u] : nullptr, attn[u] ? &*attn[u] : nullptr, cells[u]);
    });
  }
  return cells;
}

}  // namespace attnscope::analyses
