// One layer's attention shape (geometry.hpp).
#include "attnscope/geometry.hpp"

#include <cstdio>

namespace attnscope {

bool LayerGeometry::masked(int w) const {
  if (window_mask.empty() || windows == 0) return false;
  const auto n = static_cast<std::size_t>(window_tokens()) * static_cast<std::size_t>(window_tokens());
  const unsigned char* m = window_mask.data() + static_cast<std::size_t>(w) * n;
  for (std::size_t i = 0; i < n; ++i) {
    if (m[i] == 0) return true;
  }
  return false;
}

Mask LayerGeometry::unit_mask(int w) const {
  Mask m = Mask::Constant(unit_queries(), unit_keys(), true);
  if (windows == 0 || window_mask.empty()) return m;
  const int n = window_tokens();
  const unsigned char* p =
      window_mask.data() + static_cast<std::size_t>(w) * static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) m(i, j) = p[static_cast<std::size_t>(i) * n + j] != 0;
  }
  return m;
}

std::pair<int, int> LayerGeometry::query_cell(int w, int i) const {
  if (windows > 0) {
    const std::size_t at = (static_cast<std::size_t>(w) * window_tokens() + i) * 2;
    return {positions[at], positions[at + 1]};
  }
  if (!grid.on_grid(i)) return {-1, -1};
  return {grid.row(i), grid.col(i)};
}

std::pair<int, int> LayerGeometry::key_cell(int w, int j) const {
  if (windows > 0) return query_cell(w, j);
  if (!key_grid.on_grid(j)) return {-1, -1};
  return {key_grid.row(j), key_grid.col(j)};
}

std::string LayerGeometry::describe() const {
  char buf[160];
  const auto grid_text = [](const TokenGrid& g) {
    return std::to_string(g.height) + "x" + std::to_string(g.width) +
           (g.prefix > 0 ? "+" + std::to_string(g.prefix) : "");
  };
  std::snprintf(buf, sizeof buf, "%d heads x %d, ", num_heads, head_dim);
  std::string s = buf;
  if (windows > 0) {
    s += std::to_string(windows) + " windows of " + std::to_string(window_height) + "x" +
         std::to_string(window_width) + " on " + grid_text(grid);
    if (shift > 0) s += ", shift " + std::to_string(shift);
    if (second != nullptr) {
      s += ", heads " + std::to_string(second_heads_from) + ".. in " +
           std::to_string(second->windows) + " windows of " +
           std::to_string(second->window_height) + "x" + std::to_string(second->window_width);
    }
    return s;
  }
  s += "grid " + grid_text(grid);
  if (reduced()) s += ", keys " + grid_text(key_grid) + " (spatial reduction)";
  return s;
}

bool LayerGeometry::operator==(const LayerGeometry& o) const {
  const auto same = [](const TokenGrid& a, const TokenGrid& b) {
    return a.prefix == b.prefix && a.height == b.height && a.width == b.width;
  };
  return num_heads == o.num_heads && head_dim == o.head_dim && scale == o.scale &&
         same(grid, o.grid) && same(key_grid, o.key_grid) && windows == o.windows &&
         window_height == o.window_height && window_width == o.window_width && shift == o.shift &&
         positions == o.positions && window_mask == o.window_mask &&
         second_heads_from == o.second_heads_from && (second == nullptr) == (o.second == nullptr) &&
         (second == nullptr || *second == *o.second);
}

}  // namespace attnscope
