// Windows on the token grid (layout.hpp).
#include "attnscope/layout.hpp"

#include "attnscope/error.hpp"

#include <algorithm>
#include <string>

namespace attnscope {
namespace {

struct Span {
  int lo, hi;  // inclusive
};

void require_odd(int k) {
  if (k < 1 || k % 2 == 0) {
    throw UsageError("window size must be a positive odd number, got " + std::to_string(k));
  }
}

Span clipped(int centre, int half, int extent) {
  return {std::max(0, centre - half), std::min(extent - 1, centre + half)};
}

}  // namespace

TokenGrid::WindowSpan TokenGrid::window_span(int token, int k) const {
  require_odd(k);
  if (!on_grid(token)) return {};
  const Span rows = clipped(row(token), k / 2, height);
  const Span cols = clipped(col(token), k / 2, width);
  return {rows.lo, rows.hi, cols.lo, cols.hi};
}

std::vector<int> TokenGrid::window(int token, int k) const {
  std::vector<int> out;
  out.reserve(static_cast<std::size_t>(window_size(token, k)));
  for_each_in_window(token, k, [&](int j) { out.push_back(j); });
  return out;
}

std::vector<int> TokenGrid::neighbours(int token, int k) const {
  std::vector<int> out = window(token, k);
  out.erase(std::remove(out.begin(), out.end(), token), out.end());
  return out;
}

int TokenGrid::window_size(int token, int k) const {
  return window_span(token, k).cells();
}

}  // namespace attnscope
