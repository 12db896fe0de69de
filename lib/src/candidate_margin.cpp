// Host-side bookkeeping of the GPU candidate filter (candidate_margin.hpp).
#include "attnscope/candidate_margin.hpp"

#include <stdexcept>
#include <string>

namespace attnscope::margin {

std::vector<std::vector<std::pair<int, int>>> split_by_head(const std::vector<CandidatePair>& pairs, int heads) {
  std::vector<std::vector<std::pair<int, int>>> out(static_cast<std::size_t>(std::max(heads, 0)));
  for (const CandidatePair& p : pairs) {
    if (p.head < 0 || p.head >= heads) {
      throw std::out_of_range("candidate pair of head " + std::to_string(p.head) + " outside a batch of " +
                              std::to_string(heads));
    }
    out[static_cast<std::size_t>(p.head)].emplace_back(p.i, p.j);
  }
  for (auto& h : out) std::sort(h.begin(), h.end());
  return out;
}

std::int64_t retry_capacity(std::int64_t needed, std::int64_t capacity) {
  std::int64_t c = std::max<std::int64_t>(capacity, 1);
  while (c < needed) c *= 2;
  return c;
}

int heads_per_launch(std::int64_t heads, std::int64_t bytes_per_head, std::int64_t budget_bytes) {
  if (heads < 1) return 1;
  const std::int64_t fit = bytes_per_head > 0 ? budget_bytes / bytes_per_head : heads;
  return static_cast<int>(std::clamp<std::int64_t>(fit, 1, heads));
}

}  // namespace attnscope::margin
