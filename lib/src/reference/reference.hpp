// Plain-loop, double-precision references of the attention library, kept forever for tests.
//
// One file per family under families/ (weights_<name>), written from the papers' formulas entry
// by entry (no Eigen products, no shared code with the fast paths beyond the parameter drawing of
// relu_affine / f2, and no use of the family registry's maths), so that a test comparing the two
// checks the algebra of the fast paths (the affine row form, the linear-time outputs) as well as
// their arithmetic. Degenerate rows follow the library's policy: weights and outputs 0, the row
// listed in `degenerate` (sorted).
#pragma once

#include "attnscope/attention.hpp"
#include "attnscope/feature_map.hpp"
#include "attnscope/layout.hpp"
#include "attnscope/query_transform.hpp"
#include "attnscope/variant.hpp"

#include <string_view>
#include <vector>

namespace attnscope::reference {

/// phi applied entry by entry (relu_affine: the map's A, b, drawn from its seed when unset).
MatD feature_map(const FeatureMap& map, const MatD& x);

/// Whether the family has a reference (lib/src/reference/families/<name>.cpp).
bool has_weights(std::string_view family);

/// Explicit attention weights, one entry at a time, by the family's own reference file. Throws
/// UsageError for a family that has none.
MatD weights(const Variant& v, const MatD& q, const MatD& k, double scale,
             const Mask* mask = nullptr, std::vector<int>* degenerate = nullptr);

/// o_i = sum_j w_ij v_j with the weights above.
MatD outputs(const Variant& v, const MatD& q, const MatD& k, const MatD& values, double scale,
             const Mask* mask = nullptr, std::vector<int>* degenerate = nullptr);

/// The query transforms f1, f2, l2norm, none; `zero_rows` counts rows with a zero normaliser.
MatD query_transform(const QueryTransform& t, const MatD& q, int* zero_rows = nullptr);

/// Grid tokens within Chebyshev distance k/2 of `token`, by scanning the whole grid.
std::vector<int> window(const TokenGrid& grid, int token, int k);

/// local_window_mask by grid coordinates: grid query i loses key j when both are on the grid and
/// their rows and columns differ by at most k/2.
Mask local_window_mask(const TokenGrid& grid, int k);

// ---------------------------------------------------------------------------------------------
// The families of the field that need per-layer model data (RoPE rotations, agent tokens and
// position biases, learned feature scales and exponents): one file each under families/, written
// from the released code's formulas. They take that data explicitly, so they are called by name,
// not through weights(v, ...) (which throws UsageError for them: a Variant carries no such data).
// Each computes the explicit N x N weights and, apart, the output O the way the released module
// forms it (linear time: keys and values summed first), so that a test of O = W V checks both.
// Degenerate rows (a zero or tiny denominator of a paper form) get weights 0, listed in
// `degenerate` (sorted). No masks.

/// A 2-D RoPE of one head as the model stored it: token t's channel pair (2p, 2p+1) turns by the
/// angle whose cosine and sine are cos(t, p), sin(t, p); N x d/2 (d even).
struct Rotation {
  MatD cos;
  MatD sin;
};

/// cos and sin of N x d/2 angles, in double.
Rotation rotation_from_angles(const MatD& angles);

/// Each row of x (N x d) rotated pair by pair: (x0 c - x1 s, x0 s + x1 c). UsageError naming the
/// expected shape when d is odd or the rotation's shape is not N x d/2.
MatD rotate(const Rotation& rotation, const MatD& x);

/// The released MLLA, MALA and RALA codes' 2-D RoPE angles of a grid_h x grid_w grid, token t =
/// row * grid_w + col (no prefix tokens), N x d/2, in double from the formulas (the dump stores
/// the model's float32 ones; these are for tests and synthetic inputs).
///  * MLLA (`mlla`): the rotation spans all C = heads * d channels of the layer: k_max = C / 4
///    frequencies theta_m = base^(-m / k_max); channel pair P < k_max turns by row * theta_P, pair
///    P >= k_max by col * theta_(P - k_max); head h takes pairs h d/2 .. (h + 1) d/2 - 1.
///  * MALA and RALA (`retnet`): per head, f = d / 4 frequencies theta_m = base^(-m / (f - 1))
///    (torch.linspace(0, 1, f)); pair p < f turns by row * theta_p, pair p >= f by
///    col * theta_(p - f); the same for every head.
enum class RopeLayout { Mlla, RetNet };
MatD rope_angles(RopeLayout layout, int grid_h, int grid_w, int head_dim, int head = 0,
                 int num_heads = 1, double base = 10000.0);

/// q and k of the families below are what the module's projection gives (the dump's q, k): the
/// references apply the feature map (ELU+1 for MLLA, RALA, MALA; PolaFormer's signed powers).
///
/// MLLA (Han et al., "Demystify Mamba in Vision", LeapLabTHU/MLLA models/mlla.py): phi = ELU+1,
/// the rotation in the numerator only, no scale:
///   w_ij = R phi(q_i) . R phi(k_j) / (sum_m phi(q_i) . phi(k_m) + N eps),  eps = 1e-6 (code) or
///   0 (paper).
MatD mlla_weights(Convention c, const MatD& q, const MatD& k, const Rotation& rotation,
                  std::vector<int>* degenerate = nullptr);
MatD mlla_outputs(Convention c, const MatD& q, const MatD& k, const MatD& v,
                  const Rotation& rotation);

/// RALA (Fan et al., CVPR 2025, qhfan/RALA classfication/RALA.py): phi = ELU+1; keys re-weighted
/// by a softmax over the keys of the mean query, k'_j = N phi(k_j) softmax_j(s qbar . phi(k_j)),
/// qbar = mean_i phi(q_i); then MLLA's form with k':
///   w_ij = R phi(q_i) . R k'_j / (sum_m phi(q_i) . k'_m + N eps).
MatD rala_weights(Convention c, const MatD& q, const MatD& k, double scale,
                  const Rotation& rotation, std::vector<int>* degenerate = nullptr);
MatD rala_outputs(Convention c, const MatD& q, const MatD& k, const MatD& v, double scale,
                  const Rotation& rotation);

/// MALA as released (qhfan/MALA classfication_release/model.py, AddLinearAttention): phi = ELU+1,
/// z_i = s phi(q_i) . mean_m phi(k_m) from the unrotated features, the numerator rotated:
///   code:  w_ij = (s/N) R phi(q_i) . R phi(k_j) (1 + 1/(z_i + 1e-6)) - z_i / N
///   paper: w_ij = (1 + 1/S_i) R phi(q_i) . R phi(k_j) - S_i / N,  S_i = sum_m phi(q_i) . phi(k_m)
///          (MALA eq. 8-9 with
///          the released code's rotation in the numerator); degenerate where S_i is zero or tiny.
MatD mala_rope_weights(Convention c, const MatD& q, const MatD& k, double scale,
                       const Rotation& rotation, std::vector<int>* degenerate = nullptr);
MatD mala_rope_outputs(Convention c, const MatD& q, const MatD& k, const MatD& v, double scale,
                       const Rotation& rotation);

/// PolaFormer (Meng et al., ICLR 2025, PolaLinearAttention): x -> x / a (a the learned per-channel
/// scale, softplus of the parameter), then per channel t: x+ = ReLU(x)^p_t, x- = ReLU(-x)^p_t
/// (p the per-dim exponent, 1 + alpha sigmoid of the parameter); f_same(q) = [q+, q-],
/// f_opp(q) = [q-, q+], f(k) = [k+, k-]. Two maps:
///   same_ij = f_same(q_i) . f(k_j) / (sum_m f_same(q_i) . f(k_m) + N eps), opposite likewise
///   with f_opp; eps = 1e-6 (code) or 0 (paper). O = [same V_1, opposite V_2], V_1 the first
///   ceil(dv/2) value channels (torch.chunk), V_2 the rest.
struct PolaMaps {
  MatD same;
  MatD opposite;
};
PolaMaps polaformer_weights(Convention c, const MatD& q, const MatD& k, const VecD& feature_scale,
                            const VecD& exponent, std::vector<int>* degenerate_same = nullptr,
                            std::vector<int>* degenerate_opposite = nullptr);
MatD polaformer_outputs(Convention c, const MatD& q, const MatD& k, const MatD& v,
                        const VecD& feature_scale, const VecD& exponent);
/// [same V_1, opposite V_2] of given maps.
MatD polaformer_apply(const PolaMaps& maps, const MatD& v);

/// Agent attention (Han et al., ECCV 2024, LeapLabTHU/Agent-Attention models/agent_deit.py): n
/// agent tokens A (n x d); agent map G = softmax_keys(s A K^T + B1) (n x N), token map
/// T = softmax_agents(s Q A^T + B2) (N x n), W = T G (rank <= n). B1 (n x N) and B2 (N x n) are
/// the position biases as the model formed them; an empty matrix is no bias.
MatD agent_weights(const MatD& q, const MatD& k, const MatD& agents, double scale,
                   const MatD& agent_bias = MatD(), const MatD& token_bias = MatD());
MatD agent_outputs(const MatD& q, const MatD& k, const MatD& v, const MatD& agents, double scale,
                   const MatD& agent_bias = MatD(), const MatD& token_bias = MatD());
/// The released code's agents: q's grid tokens (after `prefix` tokens, grid_h x grid_w row by
/// row) average-pooled to pool_h x pool_w as torch's AdaptiveAvgPool2d bins them (bin i spans
/// rows floor(i H / P) .. ceil((i + 1) H / P) - 1); agent a = bin row * pool_w + bin column.
MatD pooled_agents(const MatD& q, int prefix, int grid_h, int grid_w, int pool_h, int pool_w);

/// O = W V, one entry at a time.
MatD apply_weights(const MatD& w, const MatD& v);

}  // namespace attnscope::reference
