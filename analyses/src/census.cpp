// Weight census of InLine and MALA weights (census.hpp).
#include "attnscope/analyses/census.hpp"

#include "attnscope/analyses/geometry_heads.hpp"
#include "attnscope/analyses/head_error.hpp"
#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"
#include "attnscope/gpu/attention.hpp"

#include <algorithm>
#include <cmath>

namespace attnscope::analyses {

void CensusCell::merge(const CensusCell& o) {
  rows += o.rows;
  weights += o.weights;
  negative += o.negative;
  zero += o.zero;
  most_negative = std::min(most_negative, o.most_negative);
  rows_not_summing_to_one += o.rows_not_summing_to_one;
  max_row_sum_error = std::max(max_row_sum_error, o.max_row_sum_error);
  degenerate_rows += o.degenerate_rows;
}

CensusColumns census_columns(const std::vector<CensusCell>& cells) {
  CensusColumns c;
  for (const CensusCell& x : cells) {
    c.rows.push_back(x.rows);
    c.weights.push_back(x.weights);
    c.negative.push_back(x.negative);
    c.zero.push_back(x.zero);
    c.most_negative.push_back(x.most_negative);
    c.rows_not_summing_to_one.push_back(x.rows_not_summing_to_one);
    c.max_row_sum_error.push_back(x.max_row_sum_error);
    c.degenerate_rows.push_back(x.degenerate_rows);
  }
  return c;
}

CensusCell census_of(const MatD& w, const std::vector<int>& degenerate, double sum_tolerance,
                     const Mask* mask) {
  CensusCell c;
  std::size_t next_degenerate = 0;  // `degenerate` is sorted
  for (Eigen::Index i = 0; i < w.rows(); ++i) {
    if (next_degenerate < degenerate.size() && degenerate[next_degenerate] == i) {
      ++next_degenerate;
      ++c.degenerate_rows;
      continue;
    }
    const auto row = w.row(i).array();
    ++c.rows;
    if (mask != nullptr) {  // the kept pairs only: a forbidden pair is no weight
      for (Eigen::Index j = 0; j < row.size(); ++j) {
        if (!(*mask)(i, j)) continue;
        ++c.weights;
        c.negative += row(j) < 0.0 ? 1 : 0;
        c.zero += row(j) == 0.0 ? 1 : 0;
        c.most_negative = std::min(c.most_negative, row(j));
      }
    } else {
      c.weights += row.size();
      c.negative += (row < 0.0).count();
      c.zero += (row == 0.0).count();
      c.most_negative = std::min(c.most_negative, row.minCoeff());
    }
    // NaN cannot reach here (dumps are checked for NaN/Inf), but would count as a failure.
    const double error = std::abs(row.sum() - 1.0);
    if (!(error <= sum_tolerance)) ++c.rows_not_summing_to_one;
    c.max_row_sum_error = std::max(c.max_row_sum_error, error);
  }
  return c;
}

CensusCell census_units(const Variant& v, const MatF& q, const MatF& k, double scale,
                        const LayerGeometry& geo, double sum_tolerance) {
  CensusCell total;
  for (int u = 0; u < geo.units(); ++u) {
    const UnitRows rows = unit_rows(v, q, k, scale, geo, u);
    std::vector<int> degenerate;
    for (std::size_t i = 0; i < rows.degenerate.size(); ++i) {
      if (rows.degenerate[i] != 0) degenerate.push_back(static_cast<int>(i));
    }
    const Mask mask = geo.unit_mask(u);
    total.merge(census_of(rows.w, degenerate, sum_tolerance, geo.masked(u) ? &mask : nullptr));
  }
  return total;
}

std::vector<Variant> default_census_variants(const DumpAttributes& attrs) {
  // code+rope names one family's released form (mala's); the others take the code formula.
  const Convention own = parse_convention(attrs.convention);
  const Convention convention = own == Convention::CodeRope ? Convention::Code : own;
  const Variant dumps = attrs.variant();
  std::vector<Variant> out;
  const auto listed = [&](const Variant& v) {
    return std::any_of(out.begin(), out.end(),
                       [&](const Variant& o) { return o.name() == v.name(); });
  };
  for (const AttentionFamily* family : all_families()) {
    if (!family->weights_can_be_negative()) continue;
    const std::string name(family->name());
    const Variant v = name == attrs.attention_family ? dumps : parse_variant(name, convention);
    // A family that needs per-layer data is walked on dumps of its own only (they hold that data).
    if (v.needs_params() && v.family != dumps.family) continue;
    if (!listed(v)) out.push_back(v);
  }
  return out;
}

CensusCollector::CensusCollector(std::vector<Variant> variants, const Selection& resolved,
                                 double scale, double sum_tolerance)
    : variants_(std::move(variants)),
      layers_(resolved.layers),
      heads_(resolved.heads),
      scale_(scale),
      tolerance_(sum_tolerance) {
  if (!(sum_tolerance >= 0.0)) {
    throw UsageError("--sum-tol must be >= 0, got " + std::to_string(sum_tolerance));
  }
  for (const Variant& v : variants_) {
    std::string why;
    if (!v.supports(&why)) {
      throw UsageError(v.name() + " cannot be counted: " + why +
                       " (pass --variant with @code to count under the code formula)");
    }
  }
  for (const Variant& v : variants_)
    for (int layer : layers_)
      for (int head : heads_) {
        CensusCell c;
        c.variant = v.name();
        c.layer = layer;
        c.head = head;
        cells_.push_back(c);
      }
}

std::size_t CensusCollector::slot(std::size_t variant, int layer, int head) const {
  const auto l = std::find(layers_.begin(), layers_.end(), layer) - layers_.begin();
  const auto h = std::find(heads_.begin(), heads_.end(), head) - heads_.begin();
  return (variant * layers_.size() + static_cast<std::size_t>(l)) * heads_.size() +
         static_cast<std::size_t>(h);
}

void CensusCollector::add_head(const HeadView& head) {
  if (head.geometry != nullptr && !head.geometry->square()) {
    for (std::size_t v = 0; v < variants_.size(); ++v) {
      const Variant variant = head_variant(variants_[v], head);
      const CensusCell part = in_head(head.image, head.layer, head.head, [&] {
        return census_units(variant, head.q, head.k, head.geometry->scale, *head.geometry,
                            tolerance_);
      });
      const std::lock_guard lock(mutex_);
      cells_[slot(v, head.layer, head.head)].merge(part);
    }
    return;
  }
  const MatD q = head.q.cast<double>(), k = head.k.cast<double>();
  const double scale = head_scale(head, scale_);
  for (std::size_t v = 0; v < variants_.size(); ++v) {
    Diagnostics diag;
    const Variant variant = head_variant(variants_[v], head);
    const MatD w = in_head(head.image, head.layer, head.head, [&] {
      return device_ == Device::Cuda
                 ? gpu::attention_weights(variant, q, k, scale, nullptr, &diag)
                 : attention_weights<double>(variant, q, k, scale, nullptr, &diag);
    });
    const CensusCell part = census_of(w, diag.degenerate_rows, tolerance_);
    const std::lock_guard lock(mutex_);
    cells_[slot(v, head.layer, head.head)].merge(part);
  }
}

std::vector<CensusCell> CensusCollector::cells() const {
  const std::lock_guard lock(mutex_);
  return cells_;
}

std::vector<CensusCell> CensusCollector::take() {
  const std::lock_guard lock(mutex_);
  std::vector<CensusCell> out = cells_;
  for (CensusCell& c : cells_) {
    CensusCell empty;
    empty.variant = std::move(c.variant);
    empty.layer = c.layer;
    empty.head = c.head;
    c = std::move(empty);
  }
  return out;
}

void CensusCollector::add(const std::vector<CensusCell>& part) {
  const std::lock_guard lock(mutex_);
  if (part.size() != cells_.size()) {
    throw Error("census: a part of " + std::to_string(part.size()) + " cells does not match the " +
                std::to_string(cells_.size()) + " of the selection");
  }
  for (std::size_t i = 0; i < part.size(); ++i) cells_[i].merge(part[i]);
}

void census_images(DumpReader& reader, const Selection& resolved, const std::vector<Variant>& variants,
                   double scale, double sum_tolerance,
                   const std::function<void(int image, std::vector<CensusCell>&&)>& sink,
                   Device device) {
  CensusCollector collector(variants, resolved, scale, sum_tolerance);
  collector.set_device(device);
  Selection without_v = resolved;  // the census looks at attention weights only: V is not read
  without_v.need_v = false;
  for_each_head(
      reader, without_v, [&](const HeadView& h) { collector.add_head(h); },
      [&](int image) { sink(image, collector.take()); });
}

}  // namespace attnscope::analyses
