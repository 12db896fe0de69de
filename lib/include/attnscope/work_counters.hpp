// Deterministic cost counters of the attention functions, kept per thread.
//
// A clock measures the machine as much as the algorithm (caches, malloc's mmap threshold, other
// load); these counters are incremented by the code that does the work, from the shapes of its
// operands, and are the same on every machine.
#pragma once

#include <cstdint>

namespace attnscope {

struct WorkCounters {
  /// Multiply-adds of the matrix products performed by the attention functions: explicit forms
  /// Q K^T (or phi(Q) phi(K)^T) and W V; linear-time forms phi(K)^T V and phi(Q) (phi(K)^T V);
  /// relu_affine's x A^T. Elementwise work (O(N d) in every form) is not counted.
  std::uint64_t multiply_adds = 0;
  /// Heap allocations of the linear-time form's scratch buffers. The scratch is kept per thread
  /// and grows to the largest call seen, so repeated calls of one size add nothing.
  std::uint64_t scratch_growths = 0;
};

/// The calling thread's counters since it started; the difference of two reads is the cost of
/// the calls in between.
WorkCounters thread_work_counters();

}  // namespace attnscope
