// A ViT forward pass in C++ (docs/model-weights.md's "Forward pass"), with interventions inside
// the attention layers: the masks of masking.hpp (renormalised as each family defines it), the
// query maps f1, f2, l2norm (query_transform.hpp) and a family swap (run the model's attention
// with another variant of the registry). The dense layers multiply in float, as the exporting
// framework's float32 layers do; the residual stream, the norms and the attention (through the
// library, in its linear-time form where the family has one and no mask forbids it) in double.
//
// Two forward passes compute the same logits bit for bit: the plain one (ReplayOptions::reference;
// Eigen matrices, the library's attention_outputs head by head, every token of every block) and
// the fast one run by default (the dense layers' weights packed once per model for
// portable::gemm_packed, the softmax heads through softmax_head_outputs, per-thread buffers, and
// the last block computed for the CLS token's row only, the one row the head reads: its keys and
// values still come from every token). Every product of both is a portable fixed-order one.
#pragma once

#include "attnscope/analyses/masking.hpp"
#include "attnscope/layout.hpp"
#include "attnscope/query_transform.hpp"
#include "attnscope/variant.hpp"
#include "attnscope/vit.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace attnscope::analyses {

struct Intervention {
  std::string name = "none";        ///< as written: none, local:3, random:9, f1, f2, l2norm, family=SPEC
  std::optional<MaskSpec> mask;     ///< remove keys
  QueryTransform transform;         ///< map the queries first
  std::optional<Variant> family;    ///< compute the attention with this variant instead
};

/// Comma-separated interventions: "none", a mask ("local:K", "random:N"), a query map ("f1",
/// "f2", "l2norm"; f2's A, b drawn from `seed`), or "family=SPEC" (a variant, parsed under the
/// model's convention). Throws UsageError naming the bad item; one named twice is refused.
[[nodiscard]] std::vector<Intervention> parse_interventions(std::string_view list, const VitModel& model,
                                                            std::uint64_t seed);

struct ReplayOptions {
  std::vector<int> layers;  ///< blocks the intervention applies to (empty: every block)
  std::uint64_t seed = 0;   ///< random masks: the same draw per (image, layer, head) as `mask`
  bool reference = false;   ///< the plain forward pass (the same logits, slower; for tests)
  /// Softmax heads without a mask in float, PyTorch's precision (softmax_head_outputs_float,
  /// attention_heads.hpp): faster, and no longer forward_reference's bits (tests bound the
  /// difference of the logits); a head whose values leave float's range is computed in double.
  /// Kernel families and masked heads stay in double. Ignored with `reference`.
  bool float_attention = false;
};

/// A model's weights laid out for replay_logits once (transposed, and packed for the products):
/// make one per model and run rather than one per batch of images. Keeps a reference to `model`,
/// which must outlive it.
class ReplayModel {
 public:
  explicit ReplayModel(const VitModel& model);
  ~ReplayModel();
  ReplayModel(ReplayModel&&) noexcept;
  ReplayModel& operator=(ReplayModel&&) noexcept;
  [[nodiscard]] const VitModel& model() const { return *model_; }
  struct Weights;
  [[nodiscard]] const Weights& weights() const { return *weights_; }

 private:
  const VitModel* model_;
  std::unique_ptr<const Weights> weights_;
};

/// Logits (images x classes) of the model on `images` (images x C*H*W, the model's normalised
/// input, as a dump's /images holds it), image i being image `image_ids[i]` for the random
/// masks' draw. Throws UsageError when the images do not fit the model.
[[nodiscard]] MatF replay_logits(const ReplayModel& model, const MatF& images, const std::vector<int>& image_ids,
                                 const Intervention& intervention, const ReplayOptions& options);
/// The same, preparing the model's weights for this call only.
[[nodiscard]] MatF replay_logits(const VitModel& model, const MatF& images, const std::vector<int>& image_ids,
                                 const Intervention& intervention, const ReplayOptions& options);

}  // namespace attnscope::analyses
