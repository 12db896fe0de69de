// Candidate pairs of the GPU confusion count: the Gram matrix G = W W^T of each head's rows by
// cuBLAS, then one thread per pair i < j applying candidate_margin.hpp's filter. The filter
// only ever proposes too many pairs, never too few; the exact judge on the CPU decides them.
#pragma once

#include "weights.cuh"

#include <utility>
#include <vector>

namespace attnscope::cuda {

/// Pairs i < j of each head of `rows` that may lie within eps (sorted per head), skipping rows
/// flagged in `degenerate` (batch x n, may be null: none). `row_bound` holds R_i (batch x n) of
/// candidate_margin.hpp. `capacity_hint` is the size of the first pair buffer tried (pairs).
std::vector<std::vector<std::pair<int, int>>> confusion_candidates(Context& ctx, const DeviceRows& rows,
                                                                   const double* row_bound,
                                                                   const unsigned char* degenerate, double eps,
                                                                   long long capacity_hint = 1 << 16);

}  // namespace attnscope::cuda
