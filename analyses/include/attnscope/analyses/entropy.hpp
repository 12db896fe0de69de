// Attention entropy per layer and head: for every query i (prefix tokens included) over all N keys,
//
//     H_i = - sum_j p_ij log(p_ij + eps)      (natural log; 0 log 0 = 0 when eps = 0)
//
// and H_i / log N, its share of the largest entropy (0 when N = 1). eps = 0 by default; eps = 1e-6
// is the convention of code that writes -(attn * log(attn + 1e-6)).sum(-1).
//
// p_ij are the weights w_ij of the variant (the registry's), as given, when no weight of the row is
// negative. Where a row has a negative weight (InLine, MALA; linear with a sign-changing map),
// -w log w is undefined, and the entropy is taken of the distribution p_ij = |w_ij| / sum_m |w_im|:
// the row's magnitudes renormalised, a proper distribution whose entropy lies in [0, log N] and
// equals the plain one wherever the weights are non-negative. Such rows are counted
// (negative_weight_rows), and the mass they put on negative weights, sum_j max(0, -w_ij), is
// reported per row (negative_mass) so that a reader can see how far they are from a distribution.
// Degenerate rows are left out and counted.
//
// Each row's share of the largest entropy, H_i / log n_i, n_i the keys query i sees: all N keys of
// an ordinary layer; on a layer of another geometry (geometry.hpp) its unit's keys, the window's
// tokens that the shifted-window mask allows, or the M keys of a spatially reduced grid.
#pragma once

#include "attnscope/analyses/query_stats.hpp"
#include "attnscope/attention.hpp"
#include "attnscope/geometry.hpp"
#include "attnscope/layout.hpp"
#include "attnscope/variant.hpp"

#include <vector>

namespace attnscope::analyses {

struct EntropyOptions {
  double log_eps = 0.0;  ///< eps in log(p + eps); >= 0
};

/// One head's entropies: per token (N entries), NaN for degenerate rows.
struct EntropyRows {
  std::vector<double> entropy;        ///< H_i in nats
  std::vector<double> negative_mass;  ///< sum_j max(0, -w_ij)
  std::vector<double> normalised;     ///< H_i / log n_i (0 for n_i = 1), NaN where H_i is
  int degenerate = 0;                 ///< degenerate rows (attention.hpp)
  int negative_rows = 0;              ///< measured rows with a negative weight (|w| renormalised)
};

/// The fast path. Softmax heads within the float range (float_softmax_rows.hpp: logit error bound
/// delta <= 2^-12) with eps = 0: float exponentials e_ij = exp(y_ij) of the max-shifted logits from
/// one fixed-order GEMM, and per row H_i = log Z_i - sum_j e_ij y_ij / Z_i, Z_i = sum_j e_ij (sums
/// in double, one portable::log per row): within delta + (1 + 2 log N) r / (1 - r) of the exact
/// entropy, r = expm1(delta) + 2^-22 (measured on DeiT-T-shaped heads: below 1e-6). Other heads:
/// the registry's weights in double (attention_weights), then one pass per row with portable::log.
/// O(N^2 d) per head. The same bits on every CPU and thread count. With a mask (attention.hpp's:
/// true = kept; q.rows() x k.rows()) the registry's masked weights in double, n_i the kept keys.
[[nodiscard]] EntropyRows attention_entropy(const Variant& v, const MatF& q, const MatF& k,
                                            double scale, const EntropyOptions& opt,
                                            const Mask* mask = nullptr);
/// Plain loops: ExactRows' double rows and std::log.
[[nodiscard]] EntropyRows attention_entropy_reference(const Variant& v, const MatF& q,
                                                      const MatF& k, double scale,
                                                      const EntropyOptions& opt);

/// A head of any layer geometry (q: geo.query_rows() x d, k: geo.key_rows() x d), unit by unit:
/// each window's rows over the window's keys with its mask, or the queries over the reduced keys;
/// each unit through attention_entropy (the float path for an unmasked softmax unit). Rows in q's
/// order. UsageError when the head is not of the geometry's shape.
[[nodiscard]] EntropyRows attention_entropy_units(const Variant& v, const MatF& q, const MatF& k,
                                                  double scale, const LayerGeometry& geo,
                                                  const EntropyOptions& opt);

/// log N (0 for N = 1): what H_i is divided by.
[[nodiscard]] double max_entropy(int tokens);

/// Quantities "entropy", "negative_mass", "normalised"; counters "degenerate_rows",
/// "negative_weight_rows"; `bins` bins over [0, log N] (N the dump's tokens).
[[nodiscard]] QueryStatsLayout entropy_layout(int tokens, int bins);
/// The per-head measure of query_stats_images; `scale`: the dump's (a head's layer geometry, where
/// the loop gives one, has its own). Heads of a layer that is not one square attention
/// (LayerGeometry::square) go unit by unit (attention_entropy_units), with or without
/// `reference`. UsageError for eps < 0.
[[nodiscard]] HeadMeasureFn entropy_measure(const EntropyOptions& opt, double scale,
                                            bool reference);

}  // namespace attnscope::analyses
