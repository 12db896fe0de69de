// Library-internal: incrementing the per-thread work counters (work_counters.hpp).
#pragma once

#include "attnscope/work_counters.hpp"

#include <Eigen/Core>

namespace attnscope::detail {

/// The calling thread's counters, for the code that does the work.
WorkCounters& thread_counters();

/// Counts the product of an m x k and a k x n matrix.
inline void count_product(Eigen::Index m, Eigen::Index k, Eigen::Index n) {
  thread_counters().multiply_adds +=
      static_cast<std::uint64_t>(m) * static_cast<std::uint64_t>(k) * static_cast<std::uint64_t>(n);
}

}  // namespace attnscope::detail
