// Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers"), as the
// ViT code that draws it computes it: per layer, the heads' weights fused (mean over the selected
// heads, or their element-wise max or min), plus the identity for the residual connection, each
// row divided by its sum,
//
//     A_l = rownorm(fuse_h(W_{l,h}) + I),       R = A_L ... A_2 A_1
//
// over the selected layers in the model's order. The CLS row of R (token 0; a dump needs a prefix
// token) is how much each token contributes to the class token: reported per image as a map over
// the grid (and the prefix tokens' own entries), and averaged over images.
//
// Weights come from the registry, every family alike; signed weights (InLine, MALA) are taken as
// given. Rows of every A_l still sum to 1, so R's rows do too. A row whose sum is not above
// kTinyDenominator times its sum of magnitudes (possible with signed weights and min fusion) is
// replaced by the identity's row (the token keeps itself) and counted.
#pragma once

#include "attnscope/analyses/dump_loop.hpp"
#include "attnscope/layout.hpp"
#include "attnscope/variant.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace attnscope::analyses {

enum class HeadFusion { Mean, Max, Min };
/// "mean", "max", "min" (UsageError naming --fusion otherwise).
[[nodiscard]] HeadFusion parse_head_fusion(const std::string& s);
[[nodiscard]] std::string to_string(HeadFusion f);

/// One layer's step A = rownorm(fuse(heads) + I); `fixed` (if given) counts the rows replaced
/// by the identity's. Heads are fused in the order given.
[[nodiscard]] MatD rollout_step(const std::vector<MatD>& heads, HeadFusion fusion,
                                int* fixed = nullptr);
/// rollout_step into `step`, reusing its storage when it has the size already (a large N x N
/// step allocated afresh for every layer of every image costs its page faults each time).
void rollout_step_into(const std::vector<MatD>& heads, HeadFusion fusion, int* fixed, MatD& step);

/// The rollout of one image: `layers[l][h]` the weights of layer l (in the model's order), head h.
/// Returns R = A_L ... A_1 (N x N). `fixed` adds the rows replaced in every step.
[[nodiscard]] MatD rollout(const std::vector<std::vector<MatD>>& layers, HeadFusion fusion,
                           int* fixed = nullptr);
/// Row 0 of rollout(layers, ...) (N entries): e_0^T A_L ... A_1 as L - 1 vector-matrix
/// products, the last layer's row first (O(L N^2), where the full product is O(L N^3)); the
/// same steps and counts, a different order of the sums (within a few ulps per product).
[[nodiscard]] VecD rollout_cls_row(const std::vector<std::vector<MatD>>& layers, HeadFusion fusion,
                                   int* fixed = nullptr);
/// One of rollout_cls_row's products: v <- v^T step, summed in step's row order for every column
/// (`next` is scratch space). Carrying e_0^T A_L through A_{L-1}, ..., A_1 this way one step at a
/// time gives rollout_cls_row's bits.
void carry_cls_row(const MatD& step, VecD& v, VecD& next);
/// The same by plain loops (fusion, normalisation and products written out).
[[nodiscard]] MatD rollout_reference(const std::vector<std::vector<MatD>>& layers,
                                     HeadFusion fusion, int* fixed = nullptr);

/// One image: per variant, the CLS row of R (N entries) and its counts.
struct RolloutImage {
  int image = 0;
  std::vector<std::vector<double>> cls;       ///< [variant][token]
  std::vector<std::int64_t> fixed_rows;       ///< [variant]
  std::vector<std::int64_t> degenerate_rows;  ///< [variant] degenerate rows of the heads' weights
};

/// Streams the selection (V not read). Softmax heads within the float range take their weights
/// from float exponentials (float_softmax_rows.hpp: each weight within a relative 2 r / (1 - r),
/// r < 2.5e-4; measured below 2e-6 on DeiT-T-shaped heads), other heads from the registry in
/// double; the CLS row by rollout_cls_row (`reference`: ExactRows' rows and rollout_reference,
/// the full product). The selected layers are taken in the
/// model's order (DumpSchema::model_layer). InputError naming the file when the dump has no
/// prefix token. Memory: the selected heads' N x N doubles of one image, per variant, when they fit
/// in the selection's max_memory (kDefaultMaxMemory when 0); otherwise the layers are taken one
/// at a time, last first, so that one layer's heads and its step are held (H + 1) N x N doubles
/// (the heads of a layer on OpenMP threads): the same products in the same order, the same bits.
/// `--reference` always holds them all (its full product needs every step).
/// Whether rollout_images holds every selected head of an image at once (true) or takes the
/// layers one at a time (false): the former when two images' heads and layer steps, 8 N^2 bytes
/// each per variant, fit in the selection's max_memory (kDefaultMaxMemory when 0), and always
/// under `reference`.
[[nodiscard]] bool rollout_holds_every_head(const DumpSchema& schema, const Selection& resolved,
                                            std::size_t variants, bool reference);

void rollout_images(DumpReader& reader, const Selection& resolved,
                    const std::vector<Variant>& variants, HeadFusion fusion, bool reference,
                    const std::function<void(RolloutImage&&)>& sink);

/// One image's rollout from its heads' queries and keys, q[l][h] and k[l][h] with the layers in
/// the model's order: the CLS row and counts rollout_images gives that image under `v` (the same
/// weights, rollout_cls_row, or with `reference` ExactRows' rows and rollout_reference), for
/// callers that hold the heads in memory (the Python module). UsageError unless every layer has
/// the same heads, and there is a prefix token (tokens > 0).
struct RolloutRow {
  std::vector<double> cls;
  std::int64_t fixed_rows = 0;
  std::int64_t degenerate_rows = 0;
};
[[nodiscard]] RolloutRow rollout_of_heads(const Variant& v,
                                          const std::vector<std::vector<MatF>>& q,
                                          const std::vector<std::vector<MatF>>& k, double scale,
                                          HeadFusion fusion, bool reference);

/// The selected layers (dump indices) in the model's order.
[[nodiscard]] std::vector<int> layers_in_model_order(const DumpSchema& schema,
                                                     std::vector<int> layers);

}  // namespace attnscope::analyses
