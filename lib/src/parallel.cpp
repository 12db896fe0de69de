// parallel_for (parallel.hpp): the first exception of any thread, rethrown on the caller.
#include "attnscope/parallel.hpp"

#include <atomic>
#include <exception>
#include <mutex>

namespace attnscope {

void parallel_for(int n, const std::function<void(int)>& body) {
  std::exception_ptr first;
  std::mutex first_mutex;
  std::atomic<bool> failed{false};
#pragma omp parallel for schedule(dynamic, 1)
  for (int i = 0; i < n; ++i) {
    // OpenMP has no portable break out of a worksharing loop: the remaining indices are skipped.
    if (failed.load(std::memory_order_relaxed)) continue;
    try {
      body(i);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(first_mutex);
      if (!first) first = std::current_exception();
      failed.store(true, std::memory_order_relaxed);
    }
  }
  if (first) std::rethrow_exception(first);
}

void parallel_run(const std::function<void()>& body) {
  std::exception_ptr first;
  std::mutex first_mutex;
#pragma omp parallel
  {
    try {
      body();
    } catch (...) {
      const std::lock_guard<std::mutex> lock(first_mutex);
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace attnscope
