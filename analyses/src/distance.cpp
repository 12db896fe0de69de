// Mean attention distance (distance.hpp): softmax heads from float exponentials
// (float_softmax_rows.hpp), others from the registry's weights in double; each grid row summed
// against a table of pixel distances indexed by |dr| and |dc|.
#include "attnscope/analyses/distance.hpp"

#include "attnscope/analyses/geometry_heads.hpp"

#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"
#include "attnscope/family.hpp"
#include "attnscope/portable_math.hpp"
#include "float_softmax_rows.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <sstream>

namespace attnscope::analyses {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string number(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

void check_head(const PatchGeometry& g, const MatF& q, const MatF& k) {
  if (q.rows() != g.grid().tokens() || k.rows() != g.grid().tokens()) {
    throw UsageError("distance: the grid has " + std::to_string(g.grid().tokens()) +
                     " tokens but the head has " + std::to_string(q.rows()) + " queries and " +
                     std::to_string(k.rows()) + " keys");
  }
}

/// One grid row's sums over the grid keys: distance-weighted, plain, absolute, and whether a
/// weight is negative. `w` is the row over all N tokens.
struct RowSums {
  double distance = 0.0, mass = 0.0, abs_mass = 0.0;
  bool negative = false;
};

RowSums grid_row_sums(const double* w, const PatchGeometry& g, int query) {
  const TokenGrid& grid = g.grid();
  const int ri = grid.row(query), ci = grid.col(query);
  RowSums s;
  for (int r = 0; r < grid.height; ++r) {
    const double* dist = g.row(std::abs(r - ri));
    const double* wr = w + grid.token(r, 0);
    for (int c = 0; c < grid.width; ++c) {
      const double x = wr[c];
      s.distance += x * dist[std::abs(c - ci)];
      s.mass += x;
      s.abs_mass += std::abs(x);
      s.negative = s.negative || x < 0.0;
    }
  }
  return s;
}

/// Softmax rows from float exponentials: grid queries are rows prefix.. of ws (the float rows
/// start there), their sums in double in lane_sum's fixed order (portable::dot_widened, sum_widened).
DistanceRows float_distance(const detail::FloatSoftmaxRows& ws, const PatchGeometry& g,
                            const DistanceOptions& opt) {
  const TokenGrid& grid = g.grid();
  const auto n = static_cast<std::size_t>(grid.tokens());
  const Eigen::Index cells = static_cast<Eigen::Index>(grid.height) * grid.width;
  thread_local std::vector<double> dist;  // the query's distance to every grid cell
  dist.resize(static_cast<std::size_t>(cells));
  DistanceRows out;
  out.distance.assign(n, kNaN);
  out.grid_mass.assign(n, kNaN);
  for (int i = grid.prefix; i < grid.tokens(); ++i) {
    const double* dd = g.cell_row(i - grid.prefix);
    if (dd == nullptr) {  // a grid above the cell table's size: the query's row assembled
      g.cell_distances(i - grid.prefix, dist.data());
      dd = dist.data();
    }
    const Eigen::Index row = i - grid.prefix;
    const float* e = ws.e.row(row).data() + grid.prefix;
    const double weighted = portable::dot_widened(e, dd, cells);  // lane_sum's order
    const double mass = portable::sum_widened(e, cells);
    const double total = ws.sum[static_cast<std::size_t>(row)];
    const auto ui = static_cast<std::size_t>(i);
    out.grid_mass[ui] = mass / total;
    if (!opt.renormalise) {
      out.distance[ui] = weighted / total;
    } else if (mass > 0.0) {
      out.distance[ui] = weighted / mass;
    } else {
      ++out.without_grid_mass;
    }
  }
  return out;
}

}  // namespace

PatchGeometry::PatchGeometry(const TokenGrid& grid, double patch_height, double patch_width)
    : grid_(grid), ph_(patch_height), pw_(patch_width) {
  if (!(ph_ > 0.0) || !(pw_ > 0.0) || !std::isfinite(ph_) || !std::isfinite(pw_)) {
    throw UsageError("--patch-size: expected a positive finite size in pixels, found " +
                     number(ph_) + (ph_ == pw_ ? "" : " x " + number(pw_)));
  }
  table_.resize(static_cast<std::size_t>(grid.height) * static_cast<std::size_t>(grid.width));
  for (int dr = 0; dr < grid.height; ++dr) {
    for (int dc = 0; dc < grid.width; ++dc) {
      const double y = dr * ph_, x = dc * pw_;
      table_[static_cast<std::size_t>(dr) * static_cast<std::size_t>(grid.width) +
             static_cast<std::size_t>(dc)] = std::sqrt(y * y + x * x);
    }
  }
  const int span = 2 * grid.width - 1;
  centred_.resize(static_cast<std::size_t>(grid.height) *
                  static_cast<std::size_t>(std::max(span, 0)));
  for (int dr = 0; dr < grid.height; ++dr) {
    for (int u = 0; u < span; ++u)
      centred_[static_cast<std::size_t>(dr) * static_cast<std::size_t>(span) +
               static_cast<std::size_t>(u)] = distance(dr, std::abs(u - (grid.width - 1)));
  }
  const std::int64_t cells = static_cast<std::int64_t>(grid.height) * grid.width;
  if (cells > 0 && cells <= kCellTableCells) {
    cells_.resize(static_cast<std::size_t>(cells * cells));
    for (int c = 0; c < cells; ++c) {
      cell_distances(c, cells_.data() + static_cast<std::ptrdiff_t>(c) * cells);
    }
  }
}

void PatchGeometry::cell_distances(int cell, double* out) const {
  const int ri = cell / grid_.width, ci = cell % grid_.width;
  for (int r = 0; r < grid_.height; ++r) {
    const double* from = centred_row(std::abs(r - ri), ci);
    std::copy(from, from + grid_.width, out + static_cast<std::ptrdiff_t>(r) * grid_.width);
  }
}

double PatchGeometry::max_distance() const {
  if (grid_.height == 0 || grid_.width == 0) return 0.0;
  return distance(grid_.height - 1, grid_.width - 1);
}

double uniform_distance(const PatchGeometry& geometry, bool renormalise) {
  const TokenGrid& grid = geometry.grid();
  const int cells = grid.height * grid.width;
  if (cells == 0) return 0.0;
  double total = 0.0;
  for (int i = grid.prefix; i < grid.tokens(); ++i) {
    double s = 0.0;
    for (int r = 0; r < grid.height; ++r) {
      for (int c = 0; c < grid.width; ++c)
        s += geometry.distance(std::abs(r - grid.row(i)), std::abs(c - grid.col(i)));
    }
    total += s / (renormalise ? cells : grid.tokens());
  }
  return total / cells;
}

PatchSize patch_size_of(const DumpReader& reader, double flag) {
  const DumpSchema& schema = reader.schema();
  const TokenGrid& grid = schema.attrs.grid;
  PatchSize p;
  if (schema.has_images) {
    for (const DatasetInfo& d : reader.datasets()) {
      const std::string tail = "/images";
      if (d.name.size() < tail.size() ||
          d.name.compare(d.name.size() - tail.size(), tail.size(), tail) != 0 ||
          d.shape.size() != 4) {
        continue;
      }
      const auto h = d.shape[2], w = d.shape[3];
      const auto gh = static_cast<std::uint64_t>(grid.height),
                 gw = static_cast<std::uint64_t>(grid.width);
      if (h % gh == 0 && w % gw == 0) {
        p.images_height = static_cast<double>(h / gh);
        p.images_width = static_cast<double>(w / gw);
      } else if (!(flag > 0.0)) {
        throw InputError(schema.files.front(), "/images",
                         "an image size divisible by the patch grid (" + std::to_string(gh) +
                             " x " + std::to_string(gw) +
                             ") to give the patch size, or --patch-size",
                         std::to_string(h) + " x " + std::to_string(w) + " pixels");
      }
      break;
    }
  }
  if (flag > 0.0) {
    p.height = p.width = flag;
    p.source = "--patch-size";
  } else if (p.images_height > 0.0) {
    p.height = p.images_height;
    p.width = p.images_width;
    p.source = "/images";
  } else {
    p.source = "grid";
  }
  return p;
}

DistanceRows attention_distance(const Variant& v, const MatF& q, const MatF& k, double scale,
                                const PatchGeometry& geometry, const DistanceOptions& opt) {
  check_head(geometry, q, k);
  const TokenGrid& grid = geometry.grid();
  if (detail::takes_float_softmax(v)) {
    detail::FloatSoftmaxRows& ws = detail::thread_float_softmax_rows();
    if (detail::float_softmax_rows(q, k, scale, grid.prefix, false, ws))
      return float_distance(ws, geometry, opt);
  }
  Diagnostics diag;
  const MatD qd = q.cast<double>(), kd = k.cast<double>();
  const MatD w = attention_weights<double>(v, qd, kd, scale, nullptr, &diag);
  std::vector<char> degenerate(static_cast<std::size_t>(grid.tokens()), 0);
  for (int i : diag.degenerate_rows) degenerate[static_cast<std::size_t>(i)] = 1;

  DistanceRows out;
  out.distance.assign(static_cast<std::size_t>(grid.tokens()), kNaN);
  out.grid_mass.assign(static_cast<std::size_t>(grid.tokens()), kNaN);
  for (int i = grid.prefix; i < grid.tokens(); ++i) {
    const auto ui = static_cast<std::size_t>(i);
    if (degenerate[ui] != 0) {
      ++out.degenerate;
      continue;
    }
    const RowSums s = grid_row_sums(w.row(i).data(), geometry, i);
    out.negative_rows += s.negative ? 1 : 0;
    out.grid_mass[ui] = s.mass;
    if (!opt.renormalise) {
      out.distance[ui] = s.distance;
    } else if (s.mass > kTinyDenominator * s.abs_mass) {
      out.distance[ui] = s.distance / s.mass;
    } else {
      ++out.without_grid_mass;
    }
  }
  return out;
}

std::pair<double, double> layer_patch(const PatchGeometry& root, const LayerGeometry& geo) {
  const TokenGrid& g = root.grid();
  return {root.patch_height() * g.height / geo.grid.height,
          root.patch_width() * g.width / geo.grid.width};
}

std::pair<double, double> key_position(const LayerGeometry& geo, int u, int j) {
  const auto [kr, kc] = geo.key_cell(u, j);
  if (kr < 0) return {-1.0, -1.0};
  if (!geo.reduced()) return {kr, kc};
  const double sy = static_cast<double>(geo.grid.height) / geo.key_grid.height;
  const double sx = static_cast<double>(geo.grid.width) / geo.key_grid.width;
  return {(kr + 0.5) * sy - 0.5, (kc + 0.5) * sx - 0.5};
}

bool distance_by_units(const PatchGeometry& root, const LayerGeometry& geo) {
  const TokenGrid& g = root.grid();
  return !geo.square() || geo.grid.prefix != g.prefix || geo.grid.height != g.height ||
         geo.grid.width != g.width;
}

namespace {

/// A layer's pixel distances from every grid query of a unit to each of its keys (NaN for prefix
/// tokens), unit_queries() x unit_keys().
MatD unit_distances(const LayerGeometry& geo, int u, double ph, double pw) {
  const int nq = geo.unit_queries(), nk = geo.unit_keys();
  MatD d = MatD::Constant(nq, nk, kNaN);
  for (int i = 0; i < nq; ++i) {
    const auto [qr, qc] = geo.query_cell(u, i);
    if (qr < 0) continue;
    for (int j = 0; j < nk; ++j) {
      const auto [kr, kc] = key_position(geo, u, j);
      if (kr < 0.0) continue;
      const double y = (qr - kr) * ph, x = (qc - kc) * pw;
      d(i, j) = std::sqrt(y * y + x * x);
    }
  }
  return d;
}

}  // namespace

DistanceRows attention_distance_units(const Variant& v, const MatF& q, const MatF& k, double scale,
                                      const LayerGeometry& geo, const PatchGeometry& root,
                                      const DistanceOptions& opt) {
  check_unit_head("distance", q, k, geo);
  const auto [ph, pw] = layer_patch(root, geo);
  const int nq = geo.unit_queries(), nk = geo.unit_keys();
  DistanceRows out;
  out.distance.assign(static_cast<std::size_t>(geo.query_rows()), kNaN);
  out.grid_mass = out.distance;
  MatD dist;  // the same for every unit of a layer without windows
  for (int u = 0; u < geo.units(); ++u) {
    if (u == 0 || geo.windows > 0) dist = unit_distances(geo, u, ph, pw);
    const UnitRows rows = unit_rows(v, q, k, scale, geo, u);
    for (int i = 0; i < nq; ++i) {
      if (geo.query_cell(u, i).first < 0) continue;  // prefix queries are dropped
      if (rows.degenerate[static_cast<std::size_t>(i)] != 0) {
        ++out.degenerate;
        continue;
      }
      RowSums s;
      for (int j = 0; j < nk; ++j) {
        if (std::isnan(dist(i, j))) continue;  // prefix keys are dropped
        const double x = rows.w(i, j);
        s.distance += x * dist(i, j);
        s.mass += x;
        s.abs_mass += std::abs(x);
        s.negative = s.negative || x < 0.0;
      }
      const auto at =
          static_cast<std::size_t>(u) * static_cast<std::size_t>(nq) + static_cast<std::size_t>(i);
      out.negative_rows += s.negative ? 1 : 0;
      out.grid_mass[at] = s.mass;
      if (!opt.renormalise) {
        out.distance[at] = s.distance;
      } else if (s.mass > kTinyDenominator * s.abs_mass) {
        out.distance[at] = s.distance / s.mass;
      } else {
        ++out.without_grid_mass;
      }
    }
  }
  return out;
}

double uniform_distance_units(const LayerGeometry& geo, const PatchGeometry& root,
                              bool renormalise) {
  const auto [ph, pw] = layer_patch(root, geo);
  const int nq = geo.unit_queries(), nk = geo.unit_keys();
  double total = 0.0;
  long long queries = 0;
  for (int u = 0; u < geo.units(); ++u) {
    const MatD dist = unit_distances(geo, u, ph, pw);
    const Mask mask = geo.unit_mask(u);
    for (int i = 0; i < nq; ++i) {
      if (geo.query_cell(u, i).first < 0) continue;
      double s = 0.0;
      int allowed = 0, grid = 0;
      for (int j = 0; j < nk; ++j) {
        if (!mask(i, j)) continue;
        ++allowed;
        if (std::isnan(dist(i, j))) continue;
        ++grid;
        s += dist(i, j);
      }
      const int n = renormalise ? grid : allowed;
      if (n == 0) continue;
      total += s / n;
      ++queries;
    }
  }
  return queries == 0 ? 0.0 : total / static_cast<double>(queries);
}

QueryStatsLayout distance_layout(const PatchGeometry& geometry, int bins) {
  if (bins < 1) throw UsageError("--bins must be at least 1, found " + std::to_string(bins));
  QueryStatsLayout layout;
  layout.quantities = {"distance", "grid_mass"};
  layout.counters = {"degenerate_rows", "negative_weight_rows", "rows_without_grid_mass"};
  layout.bins = HistogramBins{0.0, geometry.max_distance(), bins};
  return layout;
}

HeadMeasureFn distance_measure(const PatchGeometry& geometry, const DistanceOptions& opt,
                               double scale, bool reference) {
  return [geometry, opt, scale, reference](const Variant& v, const HeadView& h) {
    const double s = head_scale(h, scale);
    DistanceRows rows = h.geometry != nullptr && distance_by_units(geometry, *h.geometry)
                            ? attention_distance_units(v, h.q, h.k, s, *h.geometry, geometry, opt)
                        : reference ? attention_distance_reference(v, h.q, h.k, s, geometry, opt)
                                    : attention_distance(v, h.q, h.k, s, geometry, opt);
    HeadQueryValues out;
    out.values = {std::move(rows.distance), std::move(rows.grid_mass)};
    out.counters = {rows.degenerate, rows.negative_rows, rows.without_grid_mass};
    return out;
  };
}

}  // namespace attnscope::analyses
