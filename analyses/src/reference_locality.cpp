// Brute-force local mass: the double rows of ExactRows, summed over a window found by scanning
// every grid cell's coordinates (no use of TokenGrid::window). For tests and benchmarks.
#include "attnscope/analyses/confusion.hpp"
#include "attnscope/analyses/locality.hpp"

#include <cstdlib>
#include <limits>

namespace attnscope::analyses {

std::vector<double> local_mass_reference(const Variant& v, const MatF& q, const MatF& k, double scale,
                                         const TokenGrid& grid, int window, int* degenerate) {
  const ExactRows rows(v, q, k, scale);
  const int half = window / 2;
  std::vector<double> mass(static_cast<std::size_t>(rows.tokens()), std::numeric_limits<double>::quiet_NaN());
  VecD w(rows.tokens());
  int dead = 0;
  for (int i = grid.prefix; i < grid.tokens(); ++i) {
    if (rows.degenerate(i)) {
      ++dead;
      continue;
    }
    rows.row(i, w.data());
    const int ri = (i - grid.prefix) / grid.width, ci = (i - grid.prefix) % grid.width;
    double s = 0.0;
    for (int r = 0; r < grid.height; ++r) {
      for (int c = 0; c < grid.width; ++c) {
        if (std::abs(r - ri) <= half && std::abs(c - ci) <= half) s += w(grid.prefix + r * grid.width + c);
      }
    }
    mass[static_cast<std::size_t>(i)] = s;
  }
  if (degenerate) *degenerate = dead;
  return mass;
}

}  // namespace attnscope::analyses
