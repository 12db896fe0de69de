// Confusion, local mass and maps of heads of any layer geometry (geometry_heads.hpp).
#include "attnscope/analyses/geometry_heads.hpp"

#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"
#include "attnscope/seed.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>

namespace attnscope::analyses {

bool near_cell(const LayerGeometry& geo, int w, int i, int j, int window) {
  const auto [qr, qc] = geo.query_cell(w, i);
  const auto [kr, kc] = geo.key_cell(w, j);
  if (qr < 0 || kr < 0) return false;
  const int mr = geo.reduced() ? qr * geo.key_grid.height / geo.grid.height : qr;
  const int mc = geo.reduced() ? qc * geo.key_grid.width / geo.grid.width : qc;
  return std::abs(kr - mr) <= window / 2 && std::abs(kc - mc) <= window / 2;
}

Mask unit_removal_mask(const LayerGeometry& geo, int unit, bool local, int size,
                       std::uint64_t seed) {
  Mask m = geo.unit_mask(unit);
  const int nq = geo.unit_queries(), nk = geo.unit_keys();
  std::mt19937_64 gen(seed);
  std::vector<int> pool;
  for (int i = 0; i < nq; ++i) {
    if (geo.query_cell(unit, i).first < 0) continue;  // prefix queries keep every key
    if (local) {
      for (int j = 0; j < nk; ++j) {
        if (near_cell(geo, unit, i, j, size)) m(i, j) = false;
      }
      continue;
    }
    pool.clear();
    for (int j = 0; j < nk; ++j) {
      if (m(i, j) && geo.key_cell(unit, j).first >= 0 && !near_cell(geo, unit, i, j, 3)) {
        pool.push_back(j);
      }
    }
    const std::size_t take = std::min(pool.size(), static_cast<std::size_t>(std::max(size, 0)));
    for (std::size_t t = 0; t < take; ++t) {
      const std::size_t pick = t + detail::uniform_below(gen, pool.size() - t);
      std::swap(pool[t], pool[pick]);
      m(i, pool[t]) = false;
    }
  }
  return m;
}

void check_unit_head(const std::string& analysis, const MatF& q, const MatF& k,
                     const LayerGeometry& geo) {
  if (q.rows() != geo.query_rows() || k.rows() != geo.key_rows() || q.cols() != k.cols()) {
    throw UsageError((analysis.empty() ? "" : analysis + ": ") + "a head of " +
                     std::to_string(q.rows()) + " queries and " + std::to_string(k.rows()) +
                     " keys is not of the layer's geometry (" + geo.describe() + ")");
  }
}

std::vector<char> layers_by_units(const DumpSchema& schema, const std::vector<int>& layers) {
  std::vector<char> out(static_cast<std::size_t>(schema.attrs.num_layers), 0);
  const TokenGrid& root = schema.attrs.grid;
  for (int l : layers) {
    const LayerGeometry g = schema.geometry(l);
    const bool same_grid = g.grid.prefix == root.prefix && g.grid.height == root.height &&
                           g.grid.width == root.width;
    out[static_cast<std::size_t>(l)] = !g.square() || !same_grid ? 1 : 0;
  }
  return out;
}

UnitRows unit_rows(const Variant& v, const MatF& q, const MatF& k, double scale,
                   const LayerGeometry& geo, int unit) {
  check_unit_head("", q, k, geo);
  const int nq = geo.unit_queries(), nk = geo.unit_keys();
  const MatD qd = q.middleRows(static_cast<Eigen::Index>(unit) * nq, nq).cast<double>();
  const MatD kd = k.middleRows(static_cast<Eigen::Index>(unit) * nk, nk).cast<double>();
  const Mask mask = geo.unit_mask(unit);
  Diagnostics diag;
  UnitRows r;
  r.w = attention_weights<double>(v, qd, kd, scale, geo.masked(unit) ? &mask : nullptr, &diag);
  r.degenerate.assign(static_cast<std::size_t>(nq), 0);
  for (int i : diag.degenerate_rows) {
    r.degenerate[static_cast<std::size_t>(i)] = 1;
    r.w.row(i).setZero();
  }
  return r;
}

HeadConfusion count_confusion_units(const Variant& v, const MatF& q, const MatF& q_raw,
                                    const MatF& k, double scale, const LayerGeometry& geo,
                                    const ConfusionOptions& opt) {
  HeadConfusion out;
  const int nq = geo.unit_queries(), nk = geo.unit_keys();
  const int d = static_cast<int>(q_raw.cols());
  const double eps2 = opt.eps * opt.eps, query_eps2 = opt.query_eps * opt.query_eps;
  for (int u = 0; u < geo.units(); ++u) {
    const UnitRows rows = unit_rows(v, q, k, scale, geo, u);
    const MatD qr = q_raw.middleRows(static_cast<Eigen::Index>(u) * nq, nq).cast<double>();
    for (int i = 0; i < nq; ++i) {
      out.degenerate_rows += rows.degenerate[static_cast<std::size_t>(i)];
      for (int j = i + 1; j < nq; ++j) {
        const int dead = rows.degenerate[static_cast<std::size_t>(i)] + rows.degenerate[static_cast<std::size_t>(j)];
        if (dead == 1) continue;  // one zero row and one ordinary row: never counted
        if (dead == 0) ++out.candidates;
        const bool close = squared_distance(rows.w.row(i).data(), rows.w.row(j).data(), nk) <= eps2;
        const bool differ = squared_distance(qr.row(i).data(), qr.row(j).data(), d) > query_eps2;
        if (close && differ) ++(dead == 2 ? out.degenerate_pairs : out.pairs);
      }
    }
  }
  return out;
}

std::vector<double> local_mass_units(const Variant& v, const MatF& q, const MatF& k, double scale,
                                     const LayerGeometry& geo, int window, int* degenerate) {
  if (window < 1 || window % 2 == 0) {
    throw UsageError("window size must be a positive odd number, got " + std::to_string(window));
  }
  const int nq = geo.unit_queries(), nk = geo.unit_keys();
  std::vector<double> mass(static_cast<std::size_t>(geo.query_rows()),
                           std::numeric_limits<double>::quiet_NaN());
  int dead = 0;
  for (int u = 0; u < geo.units(); ++u) {
    const UnitRows rows = unit_rows(v, q, k, scale, geo, u);
    for (int i = 0; i < nq; ++i) {
      if (geo.query_cell(u, i).first < 0) continue;  // prefix tokens are not queries
      if (rows.degenerate[static_cast<std::size_t>(i)]) {
        ++dead;
        continue;
      }
      double s = 0.0;
      for (int j = 0; j < nk; ++j) {
        if (near_cell(geo, u, i, j, window)) s += rows.w(i, j);
      }
      mass[static_cast<std::size_t>(u) * nq + i] = s;
    }
  }
  if (degenerate != nullptr) *degenerate = dead;
  return mass;
}

double uniform_baseline_units(const LayerGeometry& geo, int window) {
  const int nq = geo.unit_queries(), nk = geo.unit_keys();
  double s = 0.0;
  long long queries = 0;
  for (int u = 0; u < geo.units(); ++u) {
    const Mask mask = geo.unit_mask(u);
    for (int i = 0; i < nq; ++i) {
      if (geo.query_cell(u, i).first < 0) continue;
      int allowed = 0, local = 0;
      for (int j = 0; j < nk; ++j) {
        if (!mask(i, j)) continue;
        ++allowed;
        local += near_cell(geo, u, i, j, window) ? 1 : 0;
      }
      if (allowed == 0) continue;
      s += static_cast<double>(local) / allowed;
      ++queries;
    }
  }
  return queries == 0 ? 0.0 : s / static_cast<double>(queries);
}

int layer_token(const TokenGrid& root, const LayerGeometry& geo, int token, int model_layer) {
  if (!root.on_grid(token)) {
    if (token < geo.grid.prefix && geo.windows == 0) return token;
    throw UsageError("--tokens: token " + std::to_string(token) +
                     " is a prefix token, and model layer " + std::to_string(model_layer) +
                     " (" + geo.describe() + ") has no such token");
  }
  const int r = root.row(token) * geo.grid.height / root.height;
  const int c = root.col(token) * geo.grid.width / root.width;
  return geo.grid.token(r, c);
}

std::optional<AttentionMap> attention_map_units(const Variant& v, const MatF& q, const MatF& k,
                                                double scale, const LayerGeometry& geo,
                                                const TokenGrid& root, int token, int model_layer) {
  const int cell_token = layer_token(root, geo, token, model_layer);
  int unit = 0, row = cell_token;
  if (geo.windows > 0) {  // the window and row holding the cell
    const int r = geo.grid.row(cell_token), c = geo.grid.col(cell_token);
    row = -1;
    for (int u = 0; u < geo.units() && row < 0; ++u) {
      for (int i = 0; i < geo.window_tokens(); ++i) {
        if (geo.query_cell(u, i) == std::make_pair(r, c)) {
          unit = u;
          row = i;
          break;
        }
      }
    }
    if (row < 0) {
      throw UsageError("--tokens: grid cell " + std::to_string(r) + ":" + std::to_string(c) +
                       " is in no window of model layer " + std::to_string(model_layer));
    }
  }
  const UnitRows rows = unit_rows(v, q, k, scale, geo, unit);
  if (rows.degenerate[static_cast<std::size_t>(row)]) return std::nullopt;
  AttentionMap m;
  m.token = token;
  const auto [qr, qc] = geo.query_cell(unit, row);
  m.query_row = qr;
  m.query_col = qc;
  m.grid = MatD::Zero(geo.key_grid.height, geo.key_grid.width);
  m.prefix.assign(static_cast<std::size_t>(geo.windows > 0 ? 0 : geo.key_grid.prefix), 0.0);
  for (int j = 0; j < geo.unit_keys(); ++j) {
    const auto [kr, kc] = geo.key_cell(unit, j);
    if (kr < 0) {
      m.prefix[static_cast<std::size_t>(j)] = rows.w(row, j);
    } else {
      m.grid(kr, kc) = rows.w(row, j);
    }
  }
  return m;
}

}  // namespace attnscope::analyses
