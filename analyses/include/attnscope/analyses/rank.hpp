// Rank diagnostics per layer and head, one value per head and image, averaged over images:
//   - the attention matrix W (N x N, the registry's weights, degenerate rows as their zero rows):
//     numerical rank and effective rank exp(H(p)), p_i = sigma_i / sum sigma (Roy & Vetterli
//     2007);
//   - the kernel families' key-value state S = F_k^T V (r x dv, F_k the family's key features,
//     the convention's factor included): numerical and effective rank (none for softmax);
//   - the smallest singular value relative to the largest, sigma_min(m, n) / sigma_max, of K,
//     [K, 1], and for the kernel families F_k and [F_k, 1]: the assumptions of InLine Prop. 1 and 3
//     (rank(K) = d, rank([K, 1]) = d + 1) and their analogues for the features, with how many
//     images had full column rank;
//   - the rank-collapse residual of the model's own attention output O (`/layers/L/out`, where the
//     dump has it): ||O - 1 o^T||_F / ||O||_F, o the mean row (Dong et al. 2021, "Attention is not
//     all you need", with the Frobenius norm in place of their composite l1,inf norm).
// Numerical rank: the singular values above tol = sigma_max * max(m, n) * 2^-52 (numpy's
// matrix_rank), or above rank_tol * sigma_max when rank_tol > 0.
#pragma once

#include "attnscope/analyses/query_stats.hpp"
#include "attnscope/layout.hpp"
#include "attnscope/variant.hpp"

#include <vector>

namespace attnscope::analyses {

struct RankOptions {
  double rank_tol = 0.0;  ///< relative tolerance; 0: numpy's rule
};

/// What one matrix's singular values say.
struct Spectrum {
  int rank = 0;
  double erank = 0.0;             ///< exp(entropy of sigma / sum sigma); 0 for a zero matrix
  double ratio = 0.0;             ///< sigma_min(m, n) / sigma_max; 0 for a zero matrix
  bool full_column_rank = false;  ///< m >= n and rank == n
};
/// From singular values in any order, of an m x n matrix.
[[nodiscard]] Spectrum spectrum_of(std::vector<double> sigma, Eigen::Index rows, Eigen::Index cols,
                                   const RankOptions& opt);

/// One head of one image. Quantities a family or dump does not have are NaN (has_kv false for
/// softmax; out_residual NaN without `out`).
struct HeadRank {
  Spectrum w, kv, k, k1, fk, fk1;
  bool has_kv = false;
  double out_residual = 0.0;
  int degenerate = 0;
};

/// Fast path: weights from the registry (one GEMM), singular values by Eigen's BDCSVD
/// (divide and conquer, O(N^3)), features from the registry. `out` may be null.
[[nodiscard]] HeadRank head_rank(const Variant& v, const MatF& q, const MatF& k, const MatF& values,
                                 const MatF* out, double scale, const RankOptions& opt);
/// Reference: ExactRows' rows, Eigen's JacobiSVD (one-sided Jacobi: another algorithm), features
/// of ExactRows, the residual by plain loops.
[[nodiscard]] HeadRank head_rank_reference(const Variant& v, const MatF& q, const MatF& k,
                                           const MatF& values, const MatF* out, double scale,
                                           const RankOptions& opt);

/// ||O - 1 o^T||_F / ||O||_F with o the mean row; NaN for O = 0.
[[nodiscard]] double collapse_residual(const MatF& out);

/// Quantities "rank", "erank", "kv_rank", "kv_erank", "k_ratio", "k1_ratio", "fk_ratio",
/// "fk1_ratio", "out_residual"; counters "degenerate_rows", "k_full_rank", "k1_full_rank",
/// "fk_full_rank", "fk1_full_rank"; the histogram of the rank over [0, N + 1] in
/// min(N + 1, 256) bins.
[[nodiscard]] QueryStatsLayout rank_layout(int tokens);
/// The per-head measure (V and, where present, out read): one value per quantity.
[[nodiscard]] HeadMeasureFn rank_measure(const RankOptions& opt, double scale, bool reference);

}  // namespace attnscope::analyses
