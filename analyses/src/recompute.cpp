// Recomputation check against the model's own tensors (recompute.hpp).
#include "attnscope/analyses/recompute.hpp"

#include "attnscope/analyses/dump_loop.hpp"
#include "attnscope/analyses/head_error.hpp"
#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"

#include <algorithm>
#include <utility>

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

void RecomputeCell::merge(const RecomputeCell& o) {
  images += o.images;
  has_out = has_out || o.has_out;
  has_attn = has_attn || o.has_attn;
  out_max_abs = std::max(out_max_abs, o.out_max_abs);
  out_max_rel = std::max(out_max_rel, o.out_max_rel);
  out_sum_abs += o.out_sum_abs;
  out_values += o.out_values;
  attn_max_abs = std::max(attn_max_abs, o.attn_max_abs);
  degenerate_rows += o.degenerate_rows;
}

std::vector<RecomputeCell> recompute_cells(const DumpSchema& s) {
  const int layers = s.attrs.num_layers, heads = s.attrs.num_heads;
  std::vector<RecomputeCell> cells(static_cast<std::size_t>(layers * heads));
  for (int l = 0; l < layers; ++l)
    for (int h = 0; h < heads; ++h) {
      cells[static_cast<std::size_t>(l * heads + h)].layer = l;
      cells[static_cast<std::size_t>(l * heads + h)].head = h;
    }
  return cells;
}

void recompute_images(DumpReader& reader, const Variant& variant, const std::vector<int>& images,
                      const std::function<void(RecomputeImage&&)>& sink,
                      const Selection& streaming) {
  const std::vector<Variant> per_layer(static_cast<std::size_t>(reader.schema().attrs.num_layers),
                                       variant);
  recompute_images(reader, per_layer, images, sink, streaming);
}

void recompute_images(DumpReader& reader, const std::vector<Variant>& per_layer,
                      const std::vector<int>& images,
                      const std::function<void(RecomputeImage&&)>& sink,
                      const Selection& streaming) {
  const DumpSchema& s = reader.schema();
  if (per_layer.size() != static_cast<std::size_t>(s.attrs.num_layers)) {
    throw UsageError("recompute: " + std::to_string(per_layer.size()) + " variants for the " +
                     std::to_string(s.attrs.num_layers) + " layers of " + s.path);
  }
  const int layers = s.attrs.num_layers, heads = s.attrs.num_heads;
  bool any = false;
  for (int l = 0; l < layers; ++l) any = any || s.layer_has_out[l] || s.layer_has_attn[l];
  if (!any) {
    throw InputError(s.path, "/layers/*/out", "the model's own outputs ('out') or weights ('attn')",
                     "neither in any layer");
  }
  Selection sel;
  sel.images = images;
  sel.max_memory = streaming.max_memory;
  sel.stats = streaming.stats;
  sel = resolve(s, sel);
  sel.need_model_tensors = true;
  RecomputeImage current;
  current.cells = recompute_cells(s);
  // Each head's cell is updated by one thread, and the image's cells are handed on when it is done.
  for_each_head(
      reader, sel,
      [&](const HeadView& hv) {
        compare_head(per_layer[static_cast<std::size_t>(hv.layer)], hv.q, hv.k, hv.v, s.attrs.scale,
                     hv.out, hv.attn,
                     current.cells[static_cast<std::size_t>(hv.layer * heads + hv.head)]);
      },
      [&](int image) {
        RecomputeImage done;
        done.image = image;
        done.cells = std::exchange(current.cells, recompute_cells(s));
        sink(std::move(done));
      });
}

std::vector<RecomputeCell> recompute_dump(DumpReader& reader, const Variant& variant,
                                          const std::vector<int>& images) {
  std::vector<RecomputeCell> cells = recompute_cells(reader.schema());
  recompute_images(reader, variant, images, [&](RecomputeImage&& img) {
    for (std::size_t c = 0; c < cells.size(); ++c) cells[c].merge(img.cells[c]);
  });
  return cells;
}

}  // namespace attnscope::analyses
