// The CUDA paths of the per-head analyses (kernels in lib/cuda/), taken by the analyses' own
// per-head code when a run's resolved device is Device::Cuda (device.hpp). Each returns what its
// CPU counterpart returns:
//  * confusion: the same counts, exactly: the GPU proposes candidate pairs with the rigorous
//    margin of candidate_margin.hpp and the CPU's exact judge (confusion.hpp) decides each one;
//  * local mass: double rows on the device, within 1e-6 of the CPU's;
//  * explicit weights: double rows, to rounding (a different summation order).
// In a build without CUDA they throw UsageError. The margin helpers below are plain host code,
// built and tested everywhere.
#pragma once

#include "attnscope/analyses/confusion.hpp"
#include "attnscope/attention.hpp"
#include "attnscope/layout.hpp"
#include "attnscope/variant.hpp"

#include <cstddef>
#include <utility>
#include <vector>

namespace attnscope::analyses {

/// Explicit N x N weights of a head, every family, under a mask or not (attention.hpp's
/// attention_weights): softmax's score form, the others' kernel form with the registry's features
/// and row forms (computed on the host, as attention.cpp computes them). `diag` receives the
/// degenerate rows.
MatD attention_weights_cuda(const Variant& v, const MatD& q, const MatD& k, double scale,
                            const Mask* mask = nullptr, Diagnostics* diag = nullptr);

/// mask_head (masking.hpp) with the weights and both outputs computed on the GPU.
struct MaskCell;
MaskCell mask_head_cuda(const Variant& v, const MatD& q, const MatD& k, const MatD& values, double scale,
                        const Mask& mask);

/// count_confusion on the GPU; equal to it on every input.
HeadConfusion count_confusion_cuda(const Variant& v, const MatF& q, const MatF& q_raw,
                                   const MatF& k, double scale, const ConfusionOptions& opt,
                                   const ExcludedTokens* excluded = nullptr);

/// One head of a batch: queries after the transform, raw queries, keys (N x d each), and the
/// excluded tokens of its image (null: none).
struct HeadInput {
  const MatF* q = nullptr;
  const MatF* q_raw = nullptr;
  const MatF* k = nullptr;
  const ExcludedTokens* excluded = nullptr;
};

/// Images whose heads the streaming confusion run sends to the GPU together (confusion_images).
inline constexpr std::size_t kCudaImagesPerLaunch = 32;

/// count_confusion_cuda of many heads (of any images) with as few launches as fit in device
/// memory: heads of one shape go to the GPU together (one copy, strided-batched products, one
/// candidate kernel per launch), the exact judging of their candidates runs on the OpenMP threads.
/// Results in the order of `heads`. count_confusion_cuda is this with one head.
std::vector<HeadConfusion> count_confusion_cuda_batch(const Variant& v, const std::vector<HeadInput>& heads,
                                                      double scale, const ConfusionOptions& opt);

/// The rows the GPU confusion count filters on (from ExactRows's inputs), downloaded: for tests.
MatD confusion_rows_cuda(const ExactRows& rows, const MatF& q, const MatF& k, double scale);

/// local_mass on the GPU.
std::vector<double> local_mass_cuda(const Variant& v, const MatF& q, const MatF& k, double scale,
                                    const TokenGrid& grid, int window, int* degenerate = nullptr);

/// R_i of every row of a head (candidate_margin.hpp): how far the GPU's row i may lie from
/// ExactRows's row i. q, k are the head's (as given to ExactRows). Plain host code.
std::vector<double> candidate_row_bounds(const ExactRows& rows, const MatF& q, const MatF& k, double scale);
/// The same for a softmax head, from q and k alone (what candidate_row_bounds uses of them),
/// written to `out` (N entries): the GPU path needs no ExactRows of a head without candidates.
void softmax_row_bounds(const MatF& q, const MatF& k, double scale, double* out);

/// The candidate filter evaluated on the host from rows computed in any way within the bounds
/// (w: N x N): the reference of the GPU's filter, for tests. Pairs i < j, sorted.
std::vector<std::pair<int, int>> candidate_pairs_host(const MatD& w, const std::vector<double>& row_bound,
                                                      const ExactRows& rows, double eps);

/// Counts a head's confused pairs from candidate pairs: each decided by the exact judge (pairs
/// with an excluded token never counted); the degenerate rows and pairs as count_confusion counts
/// them. What the GPU path does once the candidates are back; also run by tests on host-made
/// candidates.
HeadConfusion judge_candidates(const ExactRows& rows, const MatF& q_raw,
                               const ConfusionOptions& opt,
                               const std::vector<std::pair<int, int>>& candidates,
                               const ExcludedTokens* excluded = nullptr);

}  // namespace attnscope::analyses
