// Masking, the layer-local view (masking.hpp).
#include "attnscope/analyses/masking.hpp"

#include "attnscope/analyses/geometry_heads.hpp"
#include "attnscope/analyses/head_error.hpp"
#include "attnscope/error.hpp"
#include "attnscope/seed.hpp"
#include "attnscope/text.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace attnscope::analyses {

std::string MaskSpec::name() const {
  return std::string(kind == Kind::Local ? "local:" : "random:") + std::to_string(size);
}

std::vector<MaskSpec> parse_mask_specs(std::string_view specs, std::string_view flag) {
  std::vector<MaskSpec> out;
  for (const std::string_view item : split_list(specs)) {
    const auto bad = [&](const std::string& why) {
      throw UsageError(std::string(flag) + " '" + std::string(item) + "': " + why +
                       " (expected local:K with K odd >= 1, or random:N with N >= 0)");
    };
    const auto colon = item.find(':');
    if (colon == std::string_view::npos) bad("no ':'");
    MaskSpec m;
    const std::string_view kind = item.substr(0, colon), number = item.substr(colon + 1);
    if (kind == "local") {
      m.kind = MaskSpec::Kind::Local;
    } else if (kind == "random") {
      m.kind = MaskSpec::Kind::Random;
    } else {
      bad("unknown mask kind '" + std::string(kind) + "'");
    }
    const auto res = std::from_chars(number.data(), number.data() + number.size(), m.size);
    if (number.empty() || res.ec != std::errc() || res.ptr != number.data() + number.size()) {
      bad("'" + std::string(number) + "' is not an integer");
    }
    if (m.kind == MaskSpec::Kind::Local && (m.size < 1 || m.size % 2 == 0)) bad("K must be odd and >= 1");
    if (m.kind == MaskSpec::Kind::Random && m.size < 0) bad("N must be >= 0");
    for (const MaskSpec& o : out) {
      if (o.name() == m.name()) bad("named twice");
    }
    out.push_back(m);
  }
  return out;
}

Mask build_mask(const MaskSpec& spec, const TokenGrid& grid, std::uint64_t seed) {
  return spec.kind == MaskSpec::Kind::Local ? local_window_mask(grid, spec.size)
                                            : random_outside_mask(grid, spec.size, seed);
}

std::uint64_t mask_seed(std::uint64_t seed, int image, int layer, int head) {
  // Independent draws per head, the same for every family.
  return mix_seed(seed, {static_cast<std::uint64_t>(image), static_cast<std::uint64_t>(layer),
                         static_cast<std::uint64_t>(head)});
}

void MaskCell::merge(const MaskCell& o) {
  change.merge(o.change);
  removed_mass.merge(o.removed_mass);
  empty_rows += o.empty_rows;
  degenerate_rows += o.degenerate_rows;
  unmeasured_heads += o.unmeasured_heads;
}

MaskCell mask_head(const Variant& v, const MatD& q, const MatD& k, const MatD& values, double scale,
                   const Mask& mask) {
  Diagnostics plain, masked;
  const MatD w = attention_weights<double>(v, q, k, scale, nullptr, &plain);
  const MatD o = w * values;
  const MatD o_masked = attention_outputs<double>(v, q, k, values, scale, &mask, &masked);
  return mask_statistics(w, o, o_masked, plain, masked, mask);
}

namespace {

/// One block of rows into a cell's counts and removed masses and the change's two sums: the rows
/// `w` (under `base`, null: every key), their outputs without and with `mask`, both runs'
/// degenerate rows. A row is a masked query when the mask removes a key `base` keeps.
void add_rows(const MatD& w, const MatD& o, const MatD& o_masked, const Diagnostics& plain,
              const Diagnostics& masked, const Mask& mask, const Mask* base, MaskCell& c,
              double& diff2, double& base2) {
  const Eigen::Index rows = w.rows(), keys = w.cols();
  std::vector<char> skip(static_cast<std::size_t>(rows), 0);
  for (int i : plain.degenerate_rows) skip[static_cast<std::size_t>(i)] = 1, ++c.degenerate_rows;
  for (int i : masked.degenerate_rows) {
    if (!skip[static_cast<std::size_t>(i)]) skip[static_cast<std::size_t>(i)] = 1, ++c.empty_rows;
  }
  for (Eigen::Index i = 0; i < rows; ++i) {
    if (skip[static_cast<std::size_t>(i)]) continue;
    diff2 += (o_masked.row(i) - o.row(i)).squaredNorm();
    base2 += o.row(i).squaredNorm();
    bool any = false;
    double removed = 0.0;
    for (Eigen::Index j = 0; j < keys; ++j) {
      if (mask(i, j) || (base != nullptr && !(*base)(i, j))) continue;
      any = true;
      removed += w(i, j);
    }
    if (any) c.removed_mass.add(removed);  // else a prefix query: not a masked query
  }
}

void add_change(double diff2, double base2, MaskCell& c) {
  if (base2 > 0.0) {
    c.change.add(std::sqrt(diff2 / base2));
  } else {
    ++c.unmeasured_heads;
  }
}

}  // namespace

MaskCell mask_statistics(const MatD& w, const MatD& o, const MatD& o_masked,
                         const Diagnostics& plain, const Diagnostics& masked, const Mask& mask) {
  MaskCell c;
  double diff2 = 0.0, base2 = 0.0;
  add_rows(w, o, o_masked, plain, masked, mask, nullptr, c, diff2, base2);
  add_change(diff2, base2, c);
  return c;
}

MaskCell mask_units(const Variant& v, const MatF& q, const MatF& k, const MatF& values,
                    double scale, const LayerGeometry& geo, const MaskSpec& spec,
                    std::uint64_t seed) {
  check_unit_head("mask", q, k, geo);
  const int nq = geo.unit_queries(), nk = geo.unit_keys();
  MaskCell c;
  double diff2 = 0.0, base2 = 0.0;
  for (int u = 0; u < geo.units(); ++u) {
    const MatD qd = q.middleRows(static_cast<Eigen::Index>(u) * nq, nq).cast<double>();
    const MatD kd = k.middleRows(static_cast<Eigen::Index>(u) * nk, nk).cast<double>();
    const MatD vd = values.middleRows(static_cast<Eigen::Index>(u) * nk, nk).cast<double>();
    const Mask base = geo.unit_mask(u);
    const Mask* own = geo.masked(u) ? &base : nullptr;
    const Mask mask = unit_removal_mask(geo, u, spec.kind == MaskSpec::Kind::Local, spec.size,
                                        mix_seed(seed, static_cast<std::uint64_t>(u)));
    Diagnostics plain, masked;
    const MatD w = attention_weights<double>(v, qd, kd, scale, own, &plain);
    const MatD o = w * vd;
    const MatD o_masked = attention_outputs<double>(v, qd, kd, vd, scale, &mask, &masked);
    add_rows(w, o, o_masked, plain, masked, mask, own, c, diff2, base2);
  }
  add_change(diff2, base2, c);
  return c;
}

MaskCollector::MaskCollector(std::vector<Variant> variants, std::vector<MaskSpec> masks,
                             const Selection& resolved, const TokenGrid& grid, double scale,
                             std::uint64_t seed)
    : variants_(std::move(variants)),
      masks_(std::move(masks)),
      layers_(resolved.layers),
      heads_(resolved.heads),
      grid_(grid),
      scale_(scale),
      seed_(seed) {
  own_ = resolved.own_variants;
  for (const Variant& v : own_.empty() ? variants_ : own_) {
    std::string why;
    if (!v.supports(&why)) throw UsageError(v.name() + " cannot be masked: " + why);
  }
  for (const Variant& v : variants_)
    for (const MaskSpec& m : masks_)
      for (int layer : layers_)
        for (int head : heads_) {
          MaskCell c;
          // With each layer's own variant (Selection::own_variants) the cell names the layer's.
          c.variant = own_.empty() ? v.name() : own_[static_cast<std::size_t>(layer)].name();
          c.mask = m.name();
          c.layer = layer;
          c.head = head;
          cells_.push_back(c);
        }
}

void MaskCollector::add_head(const HeadView& h) {
  const auto l = static_cast<std::size_t>(std::find(layers_.begin(), layers_.end(), h.layer) -
                                          layers_.begin());
  const auto hh =
      static_cast<std::size_t>(std::find(heads_.begin(), heads_.end(), h.head) - heads_.begin());
  const auto other_grid = [this](const TokenGrid& g) {
    return g.prefix != grid_.prefix || g.height != grid_.height || g.width != grid_.width;
  };
  // Windows, reduced keys or a stage's own grid: unit by unit, on the CPU.
  if (h.geometry != nullptr && (!h.geometry->square() || other_grid(h.geometry->grid))) {
    for (std::size_t m = 0; m < masks_.size(); ++m) {
      for (std::size_t v = 0; v < variants_.size(); ++v) {
        const Variant variant =
            head_variant(own_.empty() ? variants_[v] : own_[static_cast<std::size_t>(h.layer)], h);
        const MaskCell part = in_head(h.image, h.layer, h.head, [&] {
          return mask_units(variant, h.q, h.k, h.v, h.geometry->scale, *h.geometry, masks_[m],
                            mask_seed(seed_, h.image, h.layer, h.head));
        });
        const std::size_t slot =
            ((v * masks_.size() + m) * layers_.size() + l) * heads_.size() + hh;
        const std::lock_guard lock(mutex_);
        cells_[slot].merge(part);
      }
    }
    return;
  }
  const MatD q = h.q.cast<double>(), k = h.k.cast<double>(), values = h.v.cast<double>();
  if (q.rows() != grid_.tokens()) {
    throw UsageError("mask: the grid has " + std::to_string(grid_.tokens()) + " tokens but the head has " +
                     std::to_string(q.rows()));
  }
  const double scale = head_scale(h, scale_);
  for (std::size_t m = 0; m < masks_.size(); ++m) {
    const Mask mask = build_mask(masks_[m], grid_, mask_seed(seed_, h.image, h.layer, h.head));
    for (std::size_t v = 0; v < variants_.size(); ++v) {
      const Variant variant =
          head_variant(own_.empty() ? variants_[v] : own_[static_cast<std::size_t>(h.layer)], h);
      const MaskCell part = in_head(h.image, h.layer, h.head, [&] {
        return device_ == Device::Cuda ? mask_head_cuda(variant, q, k, values, scale, mask)
                                       : mask_head(variant, q, k, values, scale, mask);
      });
      const std::size_t slot = ((v * masks_.size() + m) * layers_.size() + l) * heads_.size() + hh;
      const std::lock_guard lock(mutex_);
      cells_[slot].merge(part);
    }
  }
}

std::vector<MaskCell> MaskCollector::cells() const {
  const std::lock_guard lock(mutex_);
  return cells_;
}

std::vector<MaskCell> MaskCollector::take() {
  const std::lock_guard lock(mutex_);
  std::vector<MaskCell> out = cells_;
  for (MaskCell& c : cells_) {
    MaskCell empty;
    empty.variant = std::move(c.variant);
    empty.mask = std::move(c.mask);
    empty.layer = c.layer;
    empty.head = c.head;
    c = std::move(empty);
  }
  return out;
}

void MaskCollector::add(const std::vector<MaskCell>& part) {
  const std::lock_guard lock(mutex_);
  if (part.size() != cells_.size()) {
    throw Error("mask: a part of " + std::to_string(part.size()) + " cells does not match the " +
                std::to_string(cells_.size()) + " of the selection");
  }
  for (std::size_t i = 0; i < part.size(); ++i) cells_[i].merge(part[i]);
}

void mask_images(DumpReader& reader, const Selection& resolved, const std::vector<Variant>& variants,
                 const std::vector<MaskSpec>& masks, const TokenGrid& grid, double scale,
                 std::uint64_t seed, const std::function<void(int image, std::vector<MaskCell>&&)>& sink,
                 Device device) {
  MaskCollector collector(variants, masks, resolved, grid, scale, seed);
  collector.set_device(device);
  for_each_head(
      reader, resolved, [&](const HeadView& h) { collector.add_head(h); },
      [&](int image) { sink(image, collector.take()); });
}

}  // namespace attnscope::analyses
