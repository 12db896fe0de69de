// Per-thread work counters (work_counters.hpp).
#include "work_count.hpp"

namespace attnscope {
namespace detail {

WorkCounters& thread_counters() {
  thread_local WorkCounters counters;
  return counters;
}

}  // namespace detail

WorkCounters thread_work_counters() { return detail::thread_counters(); }

}  // namespace attnscope
