// Confusion (InLine paper, Fig. 2): pairs of queries i < j of one head whose attention rows lie
// within L2 distance eps although the queries differ.
//
// What "within eps" means, exactly: rows are computed in double by ExactRows from the
// double-converted float inputs, and a pair is confused when squared_distance(row_i, row_j)
// (a sum of squared differences in index order) is <= eps * eps, and the RAW queries (as read
// from the dump, before any query transform) satisfy squared_distance > query_eps * query_eps.
// Degenerate rows (a zero or tiny denominator of the family's row form) take part in no such pair
// and are counted.
//
// Degenerate pairs, counted apart: pairs i < j of two degenerate rows whose raw queries differ.
// Code that guards the denominator (x / (den + 1e-6), as released linear-attention code does)
// gives every such query the same all-zero row, which is how ExactRows writes a degenerate row:
// the two rows are within any eps, so the pair is a confusion by the paper's definition. The
// count a released implementation would report is pairs + degenerate_pairs. A pair of one
// degenerate and one ordinary row is never counted: where rows sum to 1, an ordinary row's L2
// norm is at least 1/sqrt(N), far beyond the eps of interest.
//
// Excluded tokens (token_filter.hpp, --exclude-tokens): a pair with an excluded token is never
// counted, neither as a confused pair nor as a degenerate pair; degenerate_rows still counts every
// degenerate row of the head. The judge (and the reference) decide it before anything else.
//
// The fast search and the brute-force reference decide every pair they keep with this same
// arithmetic, so their counts are equal, not merely close.
#pragma once

#include "attnscope/analyses/dump_loop.hpp"
#include "attnscope/analyses/token_filter.hpp"
#include "attnscope/device.hpp"
#include "attnscope/layout.hpp"
#include "attnscope/variant.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace attnscope::analyses {

/// Largest magnitude ExactRows accepts for the quantities that bound its rows: squares and sums
/// of squares of numbers up to this stay finite in double for any head that fits in memory.
inline constexpr double kMaxRowMagnitude = 1e150;

/// Attention rows of one head in double precision by plain loops over the formulas of
/// variant.hpp (phi includes the convention's factor). Row i depends on q_i and all keys only,
/// so rows can be computed one at a time.
class ExactRows {
 public:
  /// Throws NumericalError when q or k holds a non-finite value, when a feature overflows, or
  /// when the rows could overflow double: softmax when |s| max|q_i| max|k_j| > kMaxRowMagnitude;
  /// the kernel families when |F_k|_F, any |f_q(i)| |F_k|_F, or a non-degenerate row's
  /// |a_i| |f_q(i)| or (2 |a_i| + 1) |f_q(i)| |F_k|_F + 1 does (a_i of the family's RowForm:
  /// 1/den_i for normalised kernels, 1 for inline, beta_i for mala). Float inputs with the non-exp
  /// maps never come near it.
  /// q and k are read in place (a MatF, or a view of a caller's row-major buffer).
  ExactRows(const Variant& v, Eigen::Ref<const MatF> q, Eigen::Ref<const MatF> k, double scale);
  /// The constructor's checks of its inputs alone (shapes, the variant, finiteness, and for
  /// softmax the logits' bound), without computing anything: the same exceptions, in the same
  /// order. A softmax head passes it exactly when ExactRows(v, q, k, scale) would succeed.
  static void validate(const Variant& v, Eigen::Ref<const MatF> q, Eigen::Ref<const MatF> k, double scale);

  [[nodiscard]] int tokens() const { return n_; }
  [[nodiscard]] const Variant& variant() const { return variant_; }
  /// Writes row i (tokens() entries) to out; a degenerate row is written as zeros.
  void row(int i, double* out) const;
  [[nodiscard]] VecD row(int i) const;
  [[nodiscard]] bool degenerate(int i) const { return degenerate_[static_cast<std::size_t>(i)] != 0; }
  [[nodiscard]] int degenerate_count() const;

  // The kernel form (empty for softmax): the family's features f_q, f_k (convention's factor
  // included) and each row's coefficients: row i is a_i f_q(i).f_k(j) + b_i.
  [[nodiscard]] const MatD& phi_q() const { return phi_q_; }
  [[nodiscard]] const MatD& phi_k() const { return phi_k_; }
  [[nodiscard]] double row_coefficient(int i) const { return a_[static_cast<std::size_t>(i)]; }
  /// b_i of row i's kernel form (0 for softmax and degenerate rows).
  [[nodiscard]] double row_offset(int i) const { return b_[static_cast<std::size_t>(i)]; }

 private:
  [[noreturn]] void out_of_range(const std::string& what, double value) const;
  [[noreturn]] static void out_of_range(const Variant& v, const std::string& what, double value);

  Variant variant_;
  int n_ = 0;
  double scale_ = 0.0;
  MatD q_, k_;              // softmax only
  MatD phi_q_, phi_k_;      // linear families only
  std::vector<double> a_, b_;
  std::vector<char> degenerate_;
};

/// Sum of squared differences in index order: the one distance every decision uses.
double squared_distance(const double* a, const double* b, int n);

struct ConfusionOptions {
  double eps = 1e-3;        ///< L2 radius on attention rows
  double query_eps = 1e-6;  ///< raw queries closer than this are the same query, not confusion
  Device device = Device::Cpu;  ///< Cuda: the per-head counts run on the GPU (count_confusion_cuda)
  /// Tokens left out of every pair; confusion_images reads each image's (excluded_tokens).
  TokenFilter exclude;
};

/// UsageError unless eps and query_eps are finite and >= 0 (`eps_name`, `query_eps_name`: how
/// the caller calls them, `--eps` on the command line, `eps` in Python).
void check_confusion_options(const ConfusionOptions& opt, const std::string& eps_name = "eps",
                             const std::string& query_eps_name = "query_eps");

struct HeadConfusion {
  std::int64_t pairs = 0;             ///< confused pairs i < j
  int degenerate_rows = 0;            ///< rows excluded from pairs
  std::int64_t degenerate_pairs = 0;  ///< pairs i < j of degenerate rows whose raw queries differ
  std::int64_t candidates = 0;        ///< pairs the search had to look at (search statistics)
};

/// Fast exact count for one head. q: queries after the selection's transform; q_raw: as read.
/// excluded: the head's image's excluded tokens (one entry per query; null or empty: none).
HeadConfusion count_confusion(const Variant& v, const MatF& q, const MatF& q_raw, const MatF& k,
                              double scale, const ConfusionOptions& opt,
                              const ExcludedTokens* excluded = nullptr);
/// Brute force over every pair with ExactRows (O(N^2) memory and O(N^3) time): tests, bench, and
/// the list of the confused pairs themselves: when `pairs` is given, it receives every confused
/// pair (i, j), i < j, in order of i then j (degenerate pairs not included).
HeadConfusion count_confusion_reference(const Variant& v, const MatF& q, const MatF& q_raw,
                                        const MatF& k, double scale, const ConfusionOptions& opt,
                                        const ExcludedTokens* excluded = nullptr,
                                        std::vector<std::pair<int, int>>* pairs = nullptr);

// The GPU path (confusion_cuda.cpp; its pieces, for tests, in confusion_cuda.hpp): the GPU
// computes every row in double and proposes candidate pairs with the rigorous margin of
// candidate_margin.hpp; the exact judge of count_confusion decides each one, so the counts are
// count_confusion's, exactly. In a build without CUDA these throw UsageError.

/// count_confusion on the GPU; equal to it on every input.
HeadConfusion count_confusion_cuda(const Variant& v, const MatF& q, const MatF& q_raw,
                                   const MatF& k, double scale, const ConfusionOptions& opt,
                                   const ExcludedTokens* excluded = nullptr);

/// One head of a batch: queries after the transform, raw queries, keys (N x d each), and the
/// excluded tokens of its image (null: none).
struct HeadInput {
  const MatF* q = nullptr;
  const MatF* q_raw = nullptr;
  const MatF* k = nullptr;
  const ExcludedTokens* excluded = nullptr;
};

/// Images whose heads the streaming confusion run sends to the GPU together (confusion_images).
inline constexpr std::size_t kCudaImagesPerLaunch = 32;

/// count_confusion_cuda of many heads (of any images) with as few launches as fit in device
/// memory: heads of one shape go to the GPU together (one copy, strided-batched products, one
/// candidate kernel per launch), the exact judging of their candidates runs on the OpenMP threads.
/// Results in the order of `heads`. count_confusion_cuda is this with one head.
std::vector<HeadConfusion> count_confusion_cuda_batch(const Variant& v,
                                                      const std::vector<HeadInput>& heads,
                                                      double scale, const ConfusionOptions& opt);

/// The paper's bins of per-image counts: 0, 1, 2-3, 4-7, 8-15, 16-31, >=32.
inline constexpr int kConfusionBins = 7;
[[nodiscard]] int confusion_bin(std::int64_t count);
[[nodiscard]] const std::array<std::string, kConfusionBins>& confusion_bin_labels();

struct ConfusionHeadTotal {
  int layer = 0;
  int head = 0;
  std::int64_t count = 0;             ///< confused pairs, summed over images
  std::int64_t degenerate_rows = 0;   ///< summed over images
  std::int64_t degenerate_pairs = 0;  ///< summed over images
};

struct ConfusionLayerTotal {
  int layer = 0;
  std::int64_t count = 0;              ///< confused pairs of the layer's selected heads, all images
  std::int64_t degenerate_pairs = 0;   ///< the same for degenerate pairs
  std::int64_t images_with_pairs = 0;  ///< images with at least one confused pair in the layer
};

struct ConfusionResult {
  std::vector<Variant> variants;
  std::vector<std::vector<ConfusionHeadTotal>> per_head;                 ///< [variant][slot*heads+h]
  std::vector<std::vector<ConfusionLayerTotal>> per_layer;               ///< [variant][layer slot]
  std::vector<std::array<std::int64_t, kConfusionBins>> histogram;       ///< [variant][bin] images
  /// The same of each image's pairs + degenerate_pairs (the count of denominator-guarding code).
  std::vector<std::array<std::int64_t, kConfusionBins>> histogram_with_degenerate;
  std::int64_t images = 0;
  std::int64_t candidates = 0;  ///< summed over everything (search statistics)
  std::int64_t excluded_tokens = 0;                      ///< summed over images
  int min_excluded_tokens = 0, max_excluded_tokens = 0;  ///< over images (0 without images)
  /// Images with at least two tokens left, i.e. with a pair to compare.
  std::int64_t images_with_two_tokens_left = 0;
  /// With each layer's own variant (Selection::own_variants): its name by the layer the rows
  /// report; the rows' variant column then names each layer's (empty otherwise).
  std::map<int, std::string> layer_variant_names;
};

/// One image's counts, per variant and per (layer, head) slot of the selection (slot =
/// layer slot * heads + head slot, the order of ConfusionResult::per_head).
struct ConfusionImage {
  int image = 0;
  std::vector<std::vector<HeadConfusion>> heads;  ///< [variant][slot]
  int excluded_tokens = 0;                        ///< tokens of the image left out by the filter
};

/// One image's totals, per variant: over all its heads, and per layer slot.
struct ConfusionImageTotals {
  std::vector<std::int64_t> count, degenerate_pairs;  ///< [variant]
  std::vector<std::vector<std::int64_t>> layer_count;             ///< [variant][layer slot]
  std::vector<std::vector<std::int64_t>> layer_degenerate_pairs;  ///< [variant][layer slot]
};

/// Streams the selection of a dump, calling `sink` after each image, in the selection's order.
/// `reference` switches every head to the brute force. With opt.exclude active, the excluded
/// tokens of every selected image are read first (excluded_tokens: a pass over /images or the
/// mask dataset, images x tokens bytes kept).
void confusion_images(DumpReader& reader, const Selection& resolved,
                      const std::vector<Variant>& variants, const ConfusionOptions& opt,
                      bool reference, const std::function<void(ConfusionImage&&)>& sink);

/// Sums images into a ConfusionResult. Every total is a sum of integers, so the result does not
/// depend on how the images were split; add() them in the selection's order all the same.
class ConfusionTotals {
 public:
  /// `tokens`: tokens per image (the dump's num_tokens).
  ConfusionTotals(const std::vector<Variant>& variants, const Selection& resolved, int tokens);
  /// Adds one image; returns its totals.
  ConfusionImageTotals add(const ConfusionImage& img);
  [[nodiscard]] const ConfusionResult& result() const { return res_; }
  [[nodiscard]] ConfusionResult& result() { return res_; }

 private:
  ConfusionResult res_;
  int tokens_ = 0;  // tokens per image
  int heads_ = 1;   // selected heads per layer: slot / heads_ is the layer slot
};

/// Per-image callback: image index, its total count and its total degenerate pairs per variant
/// (same order as variants).
using ConfusionImageFn = std::function<void(int image, const std::vector<std::int64_t>& counts,
                                            const std::vector<std::int64_t>& degenerate_pairs)>;

/// Streams the selection of a dump and sums it (confusion_images + ConfusionTotals).
ConfusionResult run_confusion(DumpReader& reader, const Selection& resolved,
                              const std::vector<Variant>& variants, const ConfusionOptions& opt,
                              bool reference, const ConfusionImageFn& per_image);

}  // namespace attnscope::analyses
