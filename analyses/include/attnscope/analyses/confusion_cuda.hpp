// The pieces of confusion's GPU path (count_confusion_cuda, confusion.hpp; confusion_cuda.cpp),
// for its tests and benchmarks: the rigorous row bounds of candidate_margin.hpp, the candidate
// filter evaluated on the host, the exact judging of candidates, and the rows the GPU filters on.
// All but confusion_rows_cuda are plain host code, built and tested everywhere.
#pragma once

#include "attnscope/analyses/confusion.hpp"
#include "attnscope/layout.hpp"

#include <utility>
#include <vector>

namespace attnscope::analyses {

/// R_i of every row of a head (candidate_margin.hpp): how far the GPU's row i may lie from
/// ExactRows's row i. q, k are the head's (as given to ExactRows).
std::vector<double> candidate_row_bounds(const ExactRows& rows, const MatF& q, const MatF& k,
                                         double scale);
/// The same for a softmax head, from q and k alone (what candidate_row_bounds uses of them),
/// written to `out` (N entries): the GPU path needs no ExactRows of a head without candidates.
void softmax_row_bounds(const MatF& q, const MatF& k, double scale, double* out);

/// The candidate filter evaluated on the host from rows computed in any way within the bounds
/// (w: N x N): the reference of the GPU's filter, for tests. Pairs i < j, sorted.
std::vector<std::pair<int, int>> candidate_pairs_host(const MatD& w,
                                                      const std::vector<double>& row_bound,
                                                      const ExactRows& rows, double eps);

/// Counts a head's confused pairs from candidate pairs: each decided by the exact judge (pairs
/// with an excluded token never counted); the degenerate rows and pairs as count_confusion counts
/// them. What the GPU path does once the candidates are back; also run by tests on host-made
/// candidates.
HeadConfusion judge_candidates(const ExactRows& rows, const MatF& q_raw,
                               const ConfusionOptions& opt,
                               const std::vector<std::pair<int, int>>& candidates,
                               const ExcludedTokens* excluded = nullptr);

/// The rows the GPU confusion count filters on (from ExactRows's inputs), downloaded: for tests.
/// UsageError in a build without CUDA.
MatD confusion_rows_cuda(const ExactRows& rows, const MatF& q, const MatF& k, double scale);

}  // namespace attnscope::analyses
