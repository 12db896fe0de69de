// Attention of one head, for every family of the registry (family.hpp): explicit N x N weights,
// outputs (linear time where the family has a kernel form), the kernel form's features and
// low-rank form W = Z M, and per-query masks. Nothing here names a family.
//
// Inputs follow layout.hpp: q, k are N x d, v is N x dv, row-major. `scale` is s (the model's,
// normally d^-1/2). All functions are templated on the scalar (float, double) with explicit
// instantiations in the library; accumulation of sums over N is done in double.
#pragma once

#include "attnscope/family.hpp"
#include "attnscope/layout.hpp"
#include "attnscope/variant.hpp"

#include <Eigen/Core>

#include <vector>

namespace attnscope {

/// Per-query masks (Mask, layout.hpp): kept(i, j) == true when key j stays visible to query i.
/// Rows are renormalised over the kept keys: a score family over the kept logits; a kernel family
/// takes its RowForm from S_i summed over the kept keys and the kept count n_i in place of N
/// (normalised kernels divide by the kept sum; inline and mala re-derive their terms); features
/// keep the model's N (the code convention's factor, cosformer's positions). A row that keeps no
/// key is degenerate.

/// Degenerate rows found while computing. Their weights and outputs are set to 0, never NaN;
/// analyses skip them and report how many there were.
struct Diagnostics {
  /// Queries whose RowForm is degenerate: a denominator f_q(i).sum f_k that is zero or below
  /// kTinyDenominator relative to |f_q(i)| |sum f_k| (e.g. ReLU killed the whole query), or a
  /// mask that keeps no key.
  /// Sorted; each call that is given this struct replaces the list.
  std::vector<int> degenerate_rows;
  [[nodiscard]] bool clean() const { return degenerate_rows.empty(); }
};

/// Explicit N x N weights. `mask` may be null. `diag` may be null.
template <typename T>
Mat<T> attention_weights(const Variant& v, ConstRef<T> q, ConstRef<T> k, double scale,
                         const Mask* mask = nullptr, Diagnostics* diag = nullptr);

/// Outputs O = W V (N x dv). Kernel families without a mask run in O(N r dv) (InLine eq. 5,
/// MALA eq. 13, linear attention, ...) and never form W; softmax and masked runs form W row by row.
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

/// The kernel form's features of a head: f_q of the queries (token positions 0..) and f_k of the
/// keys, in double with the convention's factor (the model's N = number of keys). Throws
/// UsageError for a family without a kernel form, NumericalError naming the row of a feature that
/// is not finite.
struct KernelFeatures {
  MatD q;  ///< N_q x r
  MatD k;  ///< N x r
  /// The normaliser features g_q, g_k of a family whose S_i has its own (KernelFamily::
  /// separate_normaliser); empty otherwise: then S_i comes from q and k.
  MatD gq, gk;
  bool separate = false;
  [[nodiscard]] const MatD& norm_q() const { return separate ? gq : q; }
  [[nodiscard]] const MatD& norm_k() const { return separate ? gk : k; }
};
[[nodiscard]] KernelFeatures kernel_features(const Variant& v, ConstRef<double> q, ConstRef<double> k,
                                             double scale);
/// f_q of query rows at `positions`, against n_keys keys.
[[nodiscard]] MatD query_features(const Variant& v, ConstRef<double> q, TokenPositions positions,
                                  Eigen::Index n_keys, double scale);
/// The family's RowForm of one row (family.hpp), after refusing (NumericalError) an S or
/// magnitude that overflowed double: the tiny rule would then call the row degenerate.
[[nodiscard]] RowForm kernel_row_form(const Variant& v, double S, int n_kept, double magnitude);
/// Weights from features (no mask): w_ij = a_i fq(i).fk(j) + b_i with each row's RowForm;
/// degenerate rows are 0 and listed in `diag`. UsageError for a family whose S_i has features of
/// its own (the overload below takes them).
[[nodiscard]] MatD kernel_weights(const Variant& v, const MatD& fq, const MatD& fk,
                                  Diagnostics* diag = nullptr);
/// The same with S_i = gq(i).sum gk (KernelFamily::separate_normaliser).
[[nodiscard]] MatD kernel_weights(const Variant& v, const MatD& fq, const MatD& fk, const MatD& gq,
                                  const MatD& gk, Diagnostics* diag = nullptr);
/// g_q of query rows at `positions` (KernelFamily::separate_normaliser; f_q otherwise).
[[nodiscard]] MatD normaliser_query_features(const Variant& v, ConstRef<double> q, TokenPositions positions,
                                             Eigen::Index n_keys, double scale);

/// Low-rank form of the kernel families (no mask): W = Z M with Z = N x r', M = r' x N,
///   z_i = [a_i f_q(i), b_i],  M = [F_k^T ; 1^T]       (r' = r + 1)
/// or without the constant column for families without an offset (has_offset(), r' = r).
/// Hence |W_i - W_j|^2 = (z_i-z_j)^T (M M^T) (z_i-z_j). Degenerate rows have z_i = 0.
struct LowRankForm {
  MatD Z;  ///< N x r'
  MatD M;  ///< r' x N
};
/// Throws UsageError for a family without a kernel form (softmax).
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
