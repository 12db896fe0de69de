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
template <typename M>
double magnitude(const M& m) {
  return std::max(static_cast<double>(m.cwiseAbs().maxCoeff()), 1e-30);
}

/// The library's outputs and weights of a head of another geometry than one square attention:
/// each unit (window, or the one attention of keys from a reduced grid) computed apart with its
/// mask, the units' rows one under the other as the dump stores them.
void geometry_forms(const Variant& variant, const MatD& qd, const MatD& kd, const MatD& vd,
                    double scale, const LayerGeometry& geo, MatD* out, MatD* weights,
                    Diagnostics& diag) {
  const int nq = geo.unit_queries(), nk = geo.unit_keys();
  if (qd.rows() != geo.query_rows() || kd.rows() != geo.key_rows()) {
    throw UsageError("recompute: a head of " + std::to_string(qd.rows()) + " queries and " +
                     std::to_string(kd.rows()) + " keys, not the layer's " + geo.describe());
  }
  if (out) out->resize(qd.rows(), vd.cols());
  if (weights) weights->resize(qd.rows(), nk);
  std::vector<int> degenerate;
  for (int w = 0; w < geo.units(); ++w) {
    const Mask mask = geo.unit_mask(w);
    const Mask* m = geo.masked(w) ? &mask : nullptr;
    const auto q = qd.middleRows(static_cast<Eigen::Index>(w) * nq, nq);
    const auto k = kd.middleRows(static_cast<Eigen::Index>(w) * nk, nk);
    Diagnostics unit;
    if (out) {
      out->middleRows(static_cast<Eigen::Index>(w) * nq, nq) = attention_outputs<double>(
          variant, q, k, vd.middleRows(static_cast<Eigen::Index>(w) * nk, nk), scale, m, &unit);
    }
    if (weights) {
      weights->middleRows(static_cast<Eigen::Index>(w) * nq, nq) =
          attention_weights<double>(variant, q, k, scale, m, &unit);
    }
    for (int r : unit.degenerate_rows) degenerate.push_back(w * nq + r);
  }
  std::sort(degenerate.begin(), degenerate.end());
  degenerate.erase(std::unique(degenerate.begin(), degenerate.end()), degenerate.end());
  diag.degenerate_rows = std::move(degenerate);
}

void compare_head_in(const Variant& variant, const MatF& q, const MatF& k, const MatF& v,
                     double scale, const MatF* out_model, const MatF* attn_model,
                     RecomputeCell& cell, const LayerGeometry* geo) {
  const MatD qd = q.cast<double>(), kd = k.cast<double>(), vd = v.cast<double>();
  Diagnostics diag;
  ++cell.images;
  const bool units = geo != nullptr && !geo->square();
  if (out_model) {
    MatD out;
    if (units) {
      geometry_forms(variant, qd, kd, vd, scale, *geo, &out, nullptr, diag);
    } else {
      out = attention_outputs<double>(variant, qd, kd, vd, scale, nullptr, &diag);
    }
    // The value channels this variant's map weighs in the model's output (all but for a family of
    // several maps: PolaFormer's same-sign map weighs the first half, its opposite-sign map the
    // rest).
    const auto [c0, nc] = variant.family->output_columns(variant, static_cast<int>(out.cols()));
    const MatD err =
        (out.middleCols(c0, nc) - out_model->middleCols(c0, nc).cast<double>()).cwiseAbs();
    cell.has_out = true;
    cell.out_max_abs = std::max(cell.out_max_abs, err.maxCoeff());
    cell.out_max_rel =
        std::max(cell.out_max_rel, err.maxCoeff() / magnitude(out_model->middleCols(c0, nc)));
    cell.out_sum_abs += err.sum();
    cell.out_values += err.size();
    cell.degenerate_rows += static_cast<long long>(diag.degenerate_rows.size());
  }
  if (attn_model) {
    MatD w;
    if (units) {
      geometry_forms(variant, qd, kd, vd, scale, *geo, nullptr, &w, diag);
    } else {
      w = attention_weights<double>(variant, qd, kd, scale, nullptr, &diag);
    }
    cell.has_attn = true;
    cell.attn_max_abs =
        std::max(cell.attn_max_abs, (w - attn_model->cast<double>()).cwiseAbs().maxCoeff());
  }
}

}  // namespace

void compare_head(const Variant& variant, const MatF& q, const MatF& k, const MatF& v,
                  double scale, const MatF* out_model, const MatF* attn_model,
                  RecomputeCell& cell, const LayerGeometry* geometry) {
  in_head(-1, cell.layer, cell.head, [&] {
    compare_head_in(variant, q, k, v, scale, out_model, attn_model, cell, geometry);
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
  std::vector<RecomputeCell> cells;
  for (int l = 0; l < s.attrs.num_layers; ++l) {
    for (int h = 0; h < s.geometry(l).num_heads; ++h) {
      cells.emplace_back();
      cells.back().layer = l;
      cells.back().head = h;
    }
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
  const int layers = s.attrs.num_layers;
  std::vector<std::size_t> first_cell;  // each layer's first cell (heads differ per layer)
  for (int l = 0, at = 0; l < layers; at += s.geometry(l).num_heads, ++l) {
    first_cell.push_back(static_cast<std::size_t>(at));
  }
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
  sel.any_geometry = true;  // each unit (window, reduced keys) recomputed apart
  RecomputeImage current;
  current.cells = recompute_cells(s);
  // Each head's cell is updated by one thread, and the image's cells are handed on when it is done.
  for_each_head(
      reader, sel,
      [&](const HeadView& hv) {
        compare_head(head_variant(per_layer, static_cast<std::size_t>(hv.layer), hv), hv.q, hv.k,
                     hv.v, head_scale(hv, s.attrs.scale), hv.out, hv.attn,
                     current.cells[first_cell[static_cast<std::size_t>(hv.layer)] +
                                   static_cast<std::size_t>(hv.head)],
                     hv.geometry);
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
