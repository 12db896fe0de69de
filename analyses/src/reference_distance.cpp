// Brute-force mean attention distance: ExactRows' double rows, every key's distance computed from
// its own grid coordinates (no table, no TokenGrid helpers). For tests and benchmarks.
#include "attnscope/analyses/confusion.hpp"
#include "attnscope/analyses/distance.hpp"
#include "attnscope/error.hpp"
#include "attnscope/family.hpp"

#include <cmath>
#include <limits>

namespace attnscope::analyses {

DistanceRows attention_distance_reference(const Variant& v, const MatF& q, const MatF& k,
                                          double scale, const PatchGeometry& geometry,
                                          const DistanceOptions& opt) {
  const TokenGrid& g = geometry.grid();
  if (q.rows() != g.tokens() || k.rows() != g.tokens()) {
    throw UsageError("distance: the grid has " + std::to_string(g.tokens()) +
                     " tokens but the head has " + std::to_string(q.rows()) + " queries and " +
                     std::to_string(k.rows()) + " keys");
  }
  const ExactRows rows(v, q, k, scale);
  const int n = rows.tokens();
  DistanceRows out;
  out.distance.assign(static_cast<std::size_t>(n), std::numeric_limits<double>::quiet_NaN());
  out.grid_mass = out.distance;
  VecD w(n);
  for (int i = g.prefix; i < n; ++i) {
    if (rows.degenerate(i)) {
      ++out.degenerate;
      continue;
    }
    rows.row(i, w.data());
    const int ri = (i - g.prefix) / g.width, ci = (i - g.prefix) % g.width;
    double sum = 0.0, mass = 0.0, abs_mass = 0.0;
    bool negative = false;
    for (int j = g.prefix; j < n; ++j) {
      const int rj = (j - g.prefix) / g.width, cj = (j - g.prefix) % g.width;
      const double dy = (ri - rj) * geometry.patch_height(),
                   dx = (ci - cj) * geometry.patch_width();
      sum += w(j) * std::sqrt(dy * dy + dx * dx);
      mass += w(j);
      abs_mass += std::abs(w(j));
      if (w(j) < 0.0) negative = true;
    }
    if (negative) ++out.negative_rows;
    out.grid_mass[static_cast<std::size_t>(i)] = mass;
    if (!opt.renormalise) {
      out.distance[static_cast<std::size_t>(i)] = sum;
    } else if (mass > kTinyDenominator * abs_mass) {
      out.distance[static_cast<std::size_t>(i)] = sum / mass;
    } else {
      ++out.without_grid_mass;
    }
  }
  return out;
}

}  // namespace attnscope::analyses
