// The softmax family's own operations (lib/src/families/softmax.cpp): its rows explicit and
// masked, exact in double entry by entry, and in float. Softmax has no kernel form; these are the
// only places its weights are computed. The library and the analyses reach them through the
// registry (ScoreFamily, family.hpp: variant.score()); this header is for the family's file, its
// tests and the GPU kernels' comparisons.
#pragma once

#include "attnscope/layout.hpp"

#include <vector>

namespace attnscope {

/// Turns w, rows r0.. of q k^T (unscaled), into softmax rows over the keys `mask` keeps (all
/// when null), with the max subtracted before exp. Rows that keep no key are zeroed and appended
/// to `degenerate`.
void softmax_rows(Eigen::Ref<MatD> w, Eigen::Index r0, double scale, const Mask* mask,
                  std::vector<int>& degenerate);

/// The exact row of query qi (d entries) against k (n x d, row-major): logits scale * (qi.k_j)
/// summed in index order, the max subtracted, exp, divided by the sum. Every exact softmax count
/// is defined by this one function.
void softmax_exact_row(const double* qi, const double* k, int n, int d, double scale, double* out);

/// k (n x d, row-major) widened to double and transposed into kt (d x n, row-major): the keys'
/// layout for softmax_exact_row_t.
void transpose_keys(const MatF& k, MatD& kt);

/// softmax_exact_row with the keys transposed (kt: d x n, row-major, as transpose_keys writes it):
/// the same bits, operation for operation (each logit summed over t in increasing order from 0,
/// then scaled; the same max, exp, sum in index order and division), with the sums of all keys
/// advancing together so that the compiler vectorises them across keys.
void softmax_exact_row_t(const double* qi, const double* kt, int n, int d, double scale, double* out);

/// Float rows of q (Nq x d) against k (Nk x d): one GEMM and one exp per entry, row sums in
/// double. An approximation for searches that bound its error, never a result. q and k are read
/// in place (a MatF, or a view of a caller's row-major buffer with any row stride).
void softmax_rows_float(Eigen::Ref<const MatF> q, Eigen::Ref<const MatF> k, double scale, MatF& w);
/// softmax_rows_float before the scaling of each row: e_ij = exp(s q_i.k_j - max) in float and
/// row_factor[i] = the float reciprocal of the row's sum; softmax_rows_float's w_ij = e_ij *
/// row_factor[i], bit for bit.
void softmax_rows_float_factored(Eigen::Ref<const MatF> q, Eigen::Ref<const MatF> k, double scale, MatF& e,
                                 std::vector<float>& row_factor);

}  // namespace attnscope
