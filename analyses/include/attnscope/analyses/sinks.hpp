// Attention sinks and high-norm tokens (Xiao et al. 2024, "Efficient Streaming Language Models
// with Attention Sinks"; Darcet et al. 2024, "Vision Transformers Need Registers"), per layer and
// head of a dump:
//   - received attention: for each key j, the mean over the head's queries of w_ij (prefix
//     tokens included as queries and keys; degenerate rows left out), averaged over images;
//   - sink heads: a head has a sink in an image when one key j takes more than `threshold` of
//     every (non-degenerate) query's row, w_ij > threshold for all i; the share of (image, head)
//     pairs with one, and which keys they were;
//   - high-norm tokens, per layer (not per variant: they are read, not computed): the norm of each
//     token's value (or the model's own attention output, `out`) over the layer's selected heads,
//     ||x_t|| = sqrt(sum_h |x_{h,t}|^2), against the median over the image's tokens; a token is
//     high-norm when ||x_t|| > ratio * median.
// Weights come from the registry, every family alike, signed weights (InLine, MALA) as given.
#pragma once

#include "attnscope/analyses/dump_loop.hpp"
#include "attnscope/layout.hpp"
#include "attnscope/variant.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace attnscope::analyses {

/// Which tensor the high-norm test reads.
enum class NormSource { Values, Outputs, None };
/// "v", "out", "none" (UsageError naming --norms otherwise).
[[nodiscard]] NormSource parse_norm_source(const std::string& s);
[[nodiscard]] std::string to_string(NormSource s);

struct SinkOptions {
  double threshold = 0.5;  ///< a sink key takes more than this of every query's row
  NormSource norms = NormSource::Values;
  double norm_ratio = 4.0;  ///< high-norm: above this many times the layer's median
};
/// UsageError unless threshold is finite and norm_ratio finite and > 0.
void check_sink_options(const SinkOptions& opt);

/// One head of one image.
struct HeadSinks {
  std::vector<double> received;  ///< per key: mean over valid rows of w_ij (0s without valid rows)
  std::vector<int> sink_keys;    ///< keys with w_ij > threshold for every valid row (sorted)
  int valid_rows = 0;
  int degenerate = 0;
};

/// Fast path: softmax heads within the float range from float weights (float_softmax_rows.hpp:
/// each within a relative 2 r / (1 - r), r < 2.5e-4; measured below 2e-6 on DeiT-T-shaped heads),
/// other heads (and a softmax head with a key's smallest weight within twice that bound of the
/// threshold, so that the sink test is the exact path's) from the registry in double; then one
/// pass over W accumulating each column's sum and minimum. O(N^2 d).
[[nodiscard]] HeadSinks head_sinks(const Variant& v, const MatF& q, const MatF& k, double scale,
                                   double threshold);
/// Plain loops over ExactRows' rows, key by key.
[[nodiscard]] HeadSinks head_sinks_reference(const Variant& v, const MatF& q, const MatF& k,
                                             double scale, double threshold);

/// One layer of one image: each token's norm over the selected heads relative to the median.
struct LayerNorms {
  int layer = 0;              ///< the dump's layer index
  std::vector<double> ratio;  ///< ||x_t|| / median (0 when the median is 0 and ||x_t|| is 0)
  std::vector<char> high;     ///< ratio > norm_ratio (with a median of 0: any non-zero norm)
  double median = 0.0;
};
/// From the tokens' squared norms summed over heads.
[[nodiscard]] LayerNorms layer_norms(const std::vector<double>& squared, double norm_ratio);

/// One image: [variant][slot] heads, [layer slot] norms (empty with NormSource::None).
struct SinksImage {
  int image = 0;
  std::vector<std::vector<HeadSinks>> heads;
  std::vector<LayerNorms> norms;
};

/// Streams the selection (V, or the model's `out`, read as opt.norms needs), computing every
/// (variant, head) and every layer's norms, and calls `sink` after each image in order. A layer
/// without `out` under NormSource::Outputs is an InputError naming the file and dataset, raised
/// before anything is computed.
void sinks_images(DumpReader& reader, const Selection& resolved,
                  const std::vector<Variant>& variants, const SinkOptions& opt, bool reference,
                  const std::function<void(SinksImage&&)>& sink);

struct SinksHeadTotal {
  int layer = 0, head = 0;
  std::vector<double> received_sum;       ///< per key, the images' received summed
  std::vector<std::int64_t> sink_images;  ///< per key, images in which it was a sink of the head
  std::int64_t images = 0;                ///< images with a valid row
  std::int64_t images_with_sink = 0;
  std::int64_t degenerate_rows = 0;
  double top_received_sum = 0.0;  ///< the images' max_j received_j, summed
};
struct SinksLayerTotal {
  int layer = 0;
  std::vector<double> ratio_sum;          ///< per token, the images' ratios summed
  std::vector<std::int64_t> high_images;  ///< per token, images in which it was high-norm
  std::int64_t images = 0;
  std::int64_t high_tokens = 0;  ///< summed over images
};
struct SinksResult {
  std::vector<Variant> variants;
  std::vector<std::vector<SinksHeadTotal>> heads;  ///< [variant][slot]
  std::vector<SinksLayerTotal> layers;             ///< [layer slot] (empty without norms)
  std::int64_t images = 0;
  /// With each layer's own variant (Selection::own_variants): its name by the (model) layer the
  /// rows report (row_variant_name). Empty otherwise.
  std::map<int, std::string> layer_variant_names;
};

/// Folds images in the order add()ed (sums of doubles: add them in the selection's order).
class SinksTotals {
 public:
  SinksTotals(const std::vector<Variant>& variants, const Selection& resolved, int tokens,
              bool norms);
  void add(const SinksImage& img);
  [[nodiscard]] const SinksResult& result() const { return res_; }
  [[nodiscard]] SinksResult& result() { return res_; }

 private:
  SinksResult res_;
  int tokens_ = 0;
};

}  // namespace attnscope::analyses
