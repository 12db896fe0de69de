// One way to run a loop on OpenMP threads when its body can throw. An exception must never leave
// an OpenMP region (the runtime calls std::terminate), so every region that can throw goes
// through parallel_for: the first exception thrown in any iteration is kept, the iterations not
// yet started are skipped, and the exception is rethrown on the calling thread, unchanged (same
// type, same message) once every thread has left the region.
#pragma once

#include <functional>

namespace attnscope {

/// Runs body(i) for i in [0, n) on OpenMP threads, dynamically scheduled one index at a time
/// (each index is a unit of work as coarse as one head). Rethrows the first exception thrown by
/// any call; after a throw no further index is started. n <= 0 runs nothing.
void parallel_for(int n, const std::function<void(int)>& body);

/// Runs body() once on every thread of one OpenMP parallel region (the threads share out the work
/// themselves). Rethrows the first exception thrown by any call, once every thread has left.
void parallel_run(const std::function<void()>& body);

}  // namespace attnscope
