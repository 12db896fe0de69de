// Spikiness versus query magnitude (MALA §3.2-3.3, Fig. 2): scale one query by every factor a of a
// sweep and watch how each family's attention row sharpens, with the papers' laws checked as it
// goes:
//   softmax  ratio(a) = p^a, p = ratio(1)                                   (MALA eq. 6)
//   linear   ratio(a) = ratio(1)                                             (MALA eq. 7)
//   inline   w(a) = 1/N + a (w(1) - 1/N), every key                          (InLine eq. 4)
//   mala     ratio(a) = (A_m - x gamma) / (A_n - x gamma), x = a beta / (beta + a - 1),
//            A_j = beta phi(q).phi(k_j)                                       (MALA eq. 12)
//            beta(a) = (beta + a - 1) / a,  gamma(a) = a gamma                 (MALA eq. 11)
// where ratio(a) is the weight of the higher-ranked reference key over that of the lower one.
//
// Each family names its laws (family.hpp's magnitude_laws()); efficient and cosformer, normalised
// kernels, obey linear's.
//
// Where the query is scaled: softmax scales q; the kernel families scale their query features
// f_q (phi(q) with the convention's factor; "feature" space, what the laws assume: MALA eq. 11
// keeps the direction of phi(q) fixed). With the "query" space the kernel families see f_q(a q)
// instead; the two coincide where the family's query features are positively homogeneous
// (identity, relu, leaky_relu, focused maps; cosformer), and elsewhere the laws do not apply and
// are reported as such.
#pragma once

#include "attnscope/analyses/dump_loop.hpp"
#include "attnscope/layout.hpp"
#include "attnscope/variant.hpp"

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace attnscope::analyses {

/// Spikiness of one attention row w (N weights).
///   max_weight      max_j w_j
///   entropy         -sum_j p_j ln p_j over p_j > 0, where p = w+ / sum w+ and w+ = max(w, 0):
///                   negative weights are clipped to 0 and the rest renormalised (nats)
///   effective_keys  exp(entropy), between 1 and N
///   topk_mass       sum of the k largest weights (raw, not renormalised)
///   negatives       #{j : w_j < 0};  zeros: #{j : w_j == 0} (exact zeros, e.g. ReLU or underflow)
/// A row with no positive weight has entropy and effective_keys NaN, so that it cannot be mistaken
/// for a one-hot row.
struct RowStats {
  double max_weight = 0.0;
  double entropy = 0.0;
  double effective_keys = 1.0;
  double topk_mass = 0.0;
  int negatives = 0;
  int zeros = 0;
};
[[nodiscard]] RowStats row_stats(const VecD& w, int topk);

/// Scale factors: "LO:HI:COUNT" (COUNT values log-spaced from LO to HI, both included) or a
/// comma-separated list "0.5,1,2". Every factor must be finite and > 0. Throws UsageError.
[[nodiscard]] std::vector<double> parse_scales(std::string_view spec);

/// A reference key: chosen by its rank at a = 1 (top: the largest weight; median: rank
/// floor((N-1)/2) of the weights sorted in decreasing order, ties by key index; bottom: the
/// smallest) or given by its index.
struct KeyRef {
  enum class Kind { Top, Median, Bottom, Index };
  Kind kind = Kind::Top;
  int index = 0;
  [[nodiscard]] std::string name() const;
  /// The key index this reference denotes for the row w at a = 1. Throws UsageError when an
  /// explicit index is out of range.
  [[nodiscard]] int resolve(const VecD& w_at_one) const;
};
struct KeyPair {
  KeyRef high{KeyRef::Kind::Top, 0};
  KeyRef low{KeyRef::Kind::Median, 0};
};
/// "HIGH,LOW", each top | median | bottom | a key index. Throws UsageError.
[[nodiscard]] KeyPair parse_key_pair(std::string_view spec);

enum class ScaleSpace { Auto, Query, Feature };
[[nodiscard]] ScaleSpace parse_scale_space(std::string_view s);
[[nodiscard]] std::string to_string(ScaleSpace s);
/// Auto resolves to Query for softmax and Feature for the kernel families.
[[nodiscard]] ScaleSpace effective_space(const Variant& v, ScaleSpace s);

struct SpikinessOptions {
  std::vector<double> scales{1.0};
  KeyPair keys;
  int topk = 5;
  ScaleSpace space = ScaleSpace::Auto;
};

struct SweepPoint {
  double scale = 1.0;
  double ratio = 1.0;  ///< w_high / w_low (inf when w_low == 0 < w_high, NaN when both are 0)
  RowStats stats;
};

/// One query's sweep: reference keys (fixed at a = 1) and one point per scale.
struct QuerySweep {
  int key_high = 0;
  int key_low = 0;
  std::vector<SweepPoint> points;
  std::vector<VecD> weights;  ///< the row at each scale, when asked for (keep_weights)
};

/// The law a family should obey under the sweep (the family lists its own).
using Law = MagnitudeLaw;
[[nodiscard]] std::string to_string(Law law);

/// Largest deviation from one law over many queries and scales. Deviations (all relative):
///   softmax_power     |ln r(a) - a ln r(1)| / max(1, |a ln r(1)|)
///   linear_invariant  |r(a) / r(1) - 1|; where the higher key's weight is within kPoleGuard of
///                     0 (r = 0 where the law holds): |r(a) - r(1)| / max(1, |r(1)|, |r(a)|)
///   inline_affine     max_j |w_j(a) - 1/N - a (w_j(1) - 1/N)| / max(max_j |w_j(a)|, 1/N)
///   mala_ratio        |r(a) - p_m(a)| / max(1, |p_m(a)|), p_m from eq. 12 with beta, gamma at a =
///   1 mala_beta_gamma   max(|beta(a) - (beta+a-1)/a| / |beta(a)|, |gamma(a) - a gamma| /
///   |gamma(a)|)
/// A ratio whose lower weight is 0 (softmax underflow), or for the kernel families within
/// kPoleGuard * max_j |w_j| of 0 (where rounding dominates the ratio), has no trustworthy value to
/// compare: that point is skipped and counted.
struct LawResult {
  std::string variant;
  Law law = Law::SoftmaxPower;
  double max_deviation = 0.0;
  long queries = 0;
  long points = 0;         ///< (query, scale) pairs compared
  long skipped = 0;        ///< pairs without a finite comparison
  bool applicable = true;  ///< false: the law does not hold in this setting (see header comment)
  std::string why;         ///< why not applicable
  double threshold = 0.0;
  /// A law compared on no point has shown nothing: it does not pass.
  [[nodiscard]] bool has_data() const { return points > 0; }
  [[nodiscard]] bool pass() const {
    return !applicable || (has_data() && max_deviation <= threshold);
  }
  /// Folds another result of the same law into this one.
  void merge(const LawResult& other);
};

/// Relative deviations allowed (weights are computed in double).
inline constexpr double kLawTolerance = 1e-8;
inline constexpr double kPoleGuard = 1e-6;

/// Sweeps queries of one head for one variant. Holds the key features f_k (kernel families), so
/// that many queries of the same head share them. Thread-safe for concurrent sweep() calls.
class HeadSweeper {
 public:
  /// k: N x d keys; scale: the model's s; head_queries: every query of the head, for a family
  /// whose key features depend on them (RALA's mean query; null: none, which such a family refuses).
  HeadSweeper(const Variant& v, const MatD& k, double scale, SpikinessOptions opts,
              const MatF* head_queries = nullptr);

  /// Sweeps one query (a row of d values) at token position `token` (the features of
  /// position-dependent families need it). Adds its law deviations to `laws` (one entry per law
  /// of the family, as returned by laws()) when not null.
  [[nodiscard]] QuerySweep sweep(const VecD& q, Eigen::Index token, bool keep_weights,
                                 std::vector<LawResult>* laws) const;
  /// Empty results of the laws this family is checked against (variant, law, threshold and
  /// applicability filled in).
  [[nodiscard]] std::vector<LawResult> laws() const;
  [[nodiscard]] ScaleSpace space() const { return space_; }

 private:
  /// Rows of weights for the query q scaled by 1 (row 0) and by every scale; f_one is set to the
  /// query features at a = 1 (kernel families).
  [[nodiscard]] MatD rows(const VecD& q, Eigen::Index token, VecD& f_one) const;
  void check_laws(const VecD& q, const VecD& f_one, const MatD& w, const VecD& w1, int hi, int lo,
                  std::vector<LawResult>& laws) const;
  /// NumericalError naming the first row of f that is not finite (as attention.hpp's features).
  void require_finite_keys(const MatD& f, const char* what) const;

  Variant variant_;
  MatD keys_;        ///< K (softmax) or f_k (kernel families, the convention's factor included)
  /// g_k of a family whose row form has normaliser features of its own (separate_normaliser);
  /// empty otherwise. The sweep scales g_q with f_q: both are the query's features.
  MatD norm_keys_;
  bool separate_ = false;
  double scale_;
  SpikinessOptions opts_;
  ScaleSpace space_;
  bool homogeneous_ = true;  ///< the family's query features are positively homogeneous
  double max_key_norm_ = 0.0;  ///< max_j |k_j| (softmax: the logits' rounding bound)
};

/// MALA's per-query terms for features already carrying the convention's factor:
/// S = phi(q).sum_m phi(k_m), beta = 1 + 1/S, gamma = S / N, and the scores phi(q).phi(k_j).
/// beta and gamma are asked of v's family (its row form at S: a = beta, b = -gamma); where S = 0
/// (or NaN), beta is +inf and gamma 0. logic_error for a variant without a kernel form.
struct MalaTerms {
  double beta = 1.0;
  double gamma = 0.0;
  VecD scores;
};
[[nodiscard]] MalaTerms mala_terms(const Variant& v, const VecD& phi_q, const MatD& phi_k);

// ---- Sweeps over many queries of a dump (or of synthetic heads) --------------------------------

/// One query of a dump: image, layer (the dump's index), head, token.
struct QuerySample {
  int image = 0;
  int layer = 0;
  int head = 0;
  int token = 0;
  friend bool operator==(const QuerySample&, const QuerySample&) = default;
};

/// `count` queries drawn uniformly (seeded, with replacement avoided) among the selection's
/// (image, layer, head, token) tuples; fewer when the selection holds fewer. Sorted.
[[nodiscard]] std::vector<QuerySample> draw_samples(const Selection& resolved, int num_tokens,
                                                    int count, std::uint64_t seed);
/// Every (image, layer, head) of the selection crossed with the given tokens (validated against
/// num_tokens: UsageError naming the bad one). Sorted.
[[nodiscard]] std::vector<QuerySample> grid_samples(const Selection& resolved, int num_tokens,
                                                    const std::vector<int>& tokens);

struct SpikinessResult {
  std::vector<Variant> variants;
  std::vector<QuerySample> samples;
  std::vector<std::vector<QuerySweep>> sweeps;  ///< [variant][sample]
  std::vector<LawResult> laws;                  ///< per variant, its laws merged over samples
};

/// One image's part of a run: the sweeps of the samples in that image and the laws they fed.
struct SpikinessImage {
  int image = 0;
  std::vector<std::size_t> samples;             ///< indices into the run's samples, ascending
  std::vector<std::vector<QuerySweep>> sweeps;  ///< [variant][k]: the sweep of samples[k]
  std::vector<std::vector<LawResult>> laws;     ///< [variant]: merged over the image's samples
};

/// Sweeps every sample query for every variant as heads arrive (from for_each_head or from
/// synthetic heads). add_head() is thread-safe; each sample belongs to exactly one head.
/// A run split over images takes each image's part out (take_image) where it is computed and
/// adds it (add_image) where the result is assembled, images in the selection's order.
class SpikinessCollector {
 public:
  /// keep_weights: how many of the first samples keep their full rows (weight-distribution panel).
  SpikinessCollector(std::vector<Variant> variants, std::vector<QuerySample> samples, double scale,
                     SpikinessOptions opts, int keep_weights);
  void add_head(const HeadView& head);
  /// Moves out the sweeps of `image`'s samples and the laws collected since the last take (call
  /// it after each image, when all its heads were added). Throws Error if a sample's head of
  /// that image never arrived.
  [[nodiscard]] SpikinessImage take_image(int image);
  /// Adds an image's part (of a collector over the same variants and samples). Laws merge by
  /// maxima and sums: the result does not depend on how the images were split.
  void add_image(SpikinessImage&& image);
  /// The result; throws Error if a sample's head never arrived.
  [[nodiscard]] SpikinessResult finish();

 private:
  SpikinessResult result_;
  double scale_;
  SpikinessOptions opts_;
  int keep_weights_;
  std::vector<char> done_;
  std::vector<std::vector<LawResult>> laws_;  ///< per variant, merged as heads arrive
  std::mutex mutex_;
};

}  // namespace attnscope::analyses
