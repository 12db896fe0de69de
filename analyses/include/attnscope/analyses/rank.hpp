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
//
// Layers of another geometry (geometry.hpp) give one value per unit and image:
//  - Swin's windows: each window's N_w x N_w matrix (the shifted-window mask applied, forbidden
//    pairs 0), its K, [K, 1], features and state over the window's tokens; a masked window has no
//    one key-value state (each query sums other keys), so its kv quantities are left out (NaN);
//    the full-rank counters count windows;
//  - PVT's spatial reduction: the N x M matrix of the queries against the reduced keys, K and the
//    features M x d;
//  - the collapse residual is that of the layer's whole output (every window's rows): one value.
#pragma once

#include "attnscope/analyses/query_stats.hpp"
#include "attnscope/attention.hpp"
#include "attnscope/geometry.hpp"
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
  bool has_features = false;  ///< fk, fk1 computed (the kernel families; also under a mask)
  double out_residual = 0.0;
  int degenerate = 0;
};

/// Fast path: weights from the registry (one GEMM), singular values by singular_values.hpp
/// (fixed-order bidiagonalisation and dqds, O(N^3)), features from the registry. `out` may be null. With a mask
/// (attention.hpp's, q.rows() x k.rows(), true = kept): the masked weights, and no key-value state.
[[nodiscard]] HeadRank head_rank(const Variant& v, const MatF& q, const MatF& k, const MatF& values,
                                 const MatF* out, double scale, const RankOptions& opt,
                                 const Mask* mask = nullptr);
/// A head of any layer geometry: head_rank of each unit (a window with its mask, or the queries
/// against the reduced keys), in unit order; each unit's out_residual NaN (collapse_residual of
/// the whole output is the caller's). UsageError when the head is not of the geometry's shape.
[[nodiscard]] std::vector<HeadRank> head_rank_units(const Variant& v, const MatF& q, const MatF& k,
                                                    const MatF& values, double scale,
                                                    const LayerGeometry& geo,
                                                    const RankOptions& opt);
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
/// The per-head measure (V and, where present, out read): one value per quantity; on a layer that
/// is not one square attention (LayerGeometry::square), one per unit (head_rank_units, with or
/// without `reference`) and the output's residual once. `scale`: the dump's (a head's layer
/// geometry has its own).
[[nodiscard]] HeadMeasureFn rank_measure(const RankOptions& opt, double scale, bool reference);

}  // namespace attnscope::analyses
