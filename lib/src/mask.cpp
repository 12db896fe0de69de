// Per-query masks on the token grid (attention.hpp).
#include "attnscope/attention.hpp"

#include "attnscope/error.hpp"
#include "normal_draws.hpp"

#include <algorithm>
#include <random>
#include <string>

namespace attnscope {

Mask local_window_mask(const TokenGrid& grid, int k) {
  const int n = grid.tokens();
  Mask mask = Mask::Constant(n, n, true);
  for (int t = grid.prefix; t < n; ++t) {
    for (int j : grid.window(t, k)) mask(t, j) = false;
  }
  return mask;
}

Mask random_outside_mask(const TokenGrid& grid, int n_masked, std::uint64_t seed) {
  if (n_masked < 0) {
    throw UsageError("random mask: number of keys to mask must be >= 0, got " +
                     std::to_string(n_masked));
  }
  const int n = grid.tokens();
  Mask mask = Mask::Constant(n, n, true);
  std::mt19937_64 gen(seed);
  std::vector<int> pool;
  for (int t = grid.prefix; t < n; ++t) {
    // Grid tokens outside the 3x3 window, in token order; then a partial Fisher-Yates shuffle
    // picks n_masked of them uniformly without replacement.
    const std::vector<int> near = grid.window(t, 3);
    pool.clear();
    for (int j = grid.prefix; j < n; ++j) {
      if (!std::binary_search(near.begin(), near.end(), j)) pool.push_back(j);
    }
    const std::size_t take = std::min(pool.size(), static_cast<std::size_t>(n_masked));
    for (std::size_t m = 0; m < take; ++m) {
      const std::size_t pick = m + detail::uniform_below(gen, pool.size() - m);
      std::swap(pool[m], pool[pick]);
      mask(t, pool[m]) = false;
    }
  }
  return mask;
}

}  // namespace attnscope
