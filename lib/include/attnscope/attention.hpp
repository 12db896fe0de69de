// The four attention families for one head: explicit N x N weights, outputs (linear time where the
// family allows it), the low-rank form W = Z M of the linear families, and per-query masks.
//
// Inputs follow layout.hpp: q, k are N x d, v is N x dv, row-major. `scale` is s (the model's,
// normally d^-1/2). All functions are templated on the scalar (float, double) with explicit
// instantiations in the library; accumulation of sums over N is done in double.
#pragma once

#include "attnscope/layout.hpp"
#include "attnscope/variant.hpp"

#include <Eigen/Core>

#include <vector>

namespace attnscope {

/// Per-query masks: kept(i, j) == true when key j stays visible to query i. Rows are renormalised
/// over the kept keys: softmax and linear divide by the kept sum; inline and mala re-derive their
/// normalisation with N replaced by the kept count n_i and sums taken over kept keys (the feature
/// scaling of the code convention keeps the model's N). A row that keeps no key is degenerate.
using Mask = Eigen::Array<bool, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Degenerate rows found while computing. Their weights and outputs are set to 0, never NaN;
/// analyses skip them and report how many there were.
struct Diagnostics {
  /// Queries whose linear-attention denominator phi(q).sum phi(k) is zero or below
  /// `tiny_denominator` relative to |phi(q)| |sum phi(k)| (e.g. ReLU killed the whole query),
  /// or whose mala denominator is zero, or whose mask keeps no key.
  /// Sorted; each call that is given this struct replaces the list.
  std::vector<int> degenerate_rows;
  [[nodiscard]] bool clean() const { return degenerate_rows.empty(); }
};

/// Relative threshold under which a normalising denominator counts as zero.
inline constexpr double kTinyDenominator = 1e-12;

/// Explicit N x N weights. `mask` may be null. `diag` may be null.
template <typename T>
Mat<T> attention_weights(const Variant& v, ConstRef<T> q, ConstRef<T> k, double scale,
                         const Mask* mask = nullptr, Diagnostics* diag = nullptr);

/// Outputs O = W V (N x dv). Linear families without a mask run in O(N d dv) (InLine eq. 5,
/// MALA eq. 13, linear attention) and never form W; softmax and masked runs form W row by row.
template <typename T>
Mat<T> attention_outputs(const Variant& v, ConstRef<T> q, ConstRef<T> k, ConstRef<T> v_in,
                         double scale, const Mask* mask = nullptr, Diagnostics* diag = nullptr);

/// attention_outputs written into `out` (q.rows() x v_in.cols(), allocated by the caller). The
/// linear-time form keeps its scratch per thread between calls (work_counters.hpp counts its
/// growths), so repeated calls of one size allocate nothing; softmax and masked runs form W row by
/// row as attention_outputs does.
template <typename T>
void attention_outputs_into(const Variant& v, ConstRef<T> q, ConstRef<T> k, ConstRef<T> v_in,
                            double scale, Eigen::Ref<Mat<T>> out, const Mask* mask = nullptr,
                            Diagnostics* diag = nullptr);

/// Outputs through the explicit weights, whatever the family (for comparisons and timing).
template <typename T>
Mat<T> attention_outputs_explicit(const Variant& v, ConstRef<T> q, ConstRef<T> k,
                                  const Mat<T>& v_in, double scale, const Mask* mask = nullptr,
                                  Diagnostics* diag = nullptr);

/// Low-rank form of the linear families (no mask): W = Z M with Z = N x r, M = r x N.
///   linear: z_i = phi(q_i) / (phi(q_i).sum phi(k)),  M = phi(K)^T               (r = d')
///   inline: z_i = [phi(q_i), 1],  M = [(phi(K) - mean phi(K))^T ; (1/N) 1^T]      (r = d'+1)
///   mala:   z_i = [beta_i phi(q_i), gamma_i],  M = [phi(K)^T ; -1^T]              (r = d'+1)
/// with phi including the convention's factor. Hence |W_i - W_j|^2 = (z_i-z_j)^T (M M^T) (z_i-z_j).
struct LowRankForm {
  MatD Z;  ///< N x r
  MatD M;  ///< r x N
};
/// Throws UsageError for softmax.
template <typename T>
LowRankForm low_rank_form(const Variant& v, ConstRef<T> q, ConstRef<T> k, double scale,
                          Diagnostics* diag = nullptr);

/// Mask helpers on a token grid (N = grid.tokens()). Prefix-token queries keep every key.
/// Removes each grid query's clipped k x k window (itself included) from its keys.
Mask local_window_mask(const TokenGrid& grid, int k);
/// Removes n keys drawn uniformly (seeded) among the grid tokens outside each grid query's 3x3
/// window (fewer if fewer exist).
Mask random_outside_mask(const TokenGrid& grid, int n, std::uint64_t seed);

}  // namespace attnscope
