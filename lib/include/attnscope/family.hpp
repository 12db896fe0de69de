// The registry of attention families: each family's maths, defined once, in one file of its own
// under lib/src/families/. Everything else (explicit weights, linear-time outputs, the low-rank
// form, masks, every analysis) asks the family through this interface and never names one.
//
// Two forms exist:
//  * the kernel form, w_ij = a_i f_q(i).f_k(j) + b_i over the kept keys, where f_q, f_k are the
//    family's query and key features (a feature map, the convention's factor, token positions...)
//    and (a_i, b_i) come from S_i = f_q(i).sum_kept f_k and the number n_i of kept keys
//    (KernelFamily): linear, inline, mala, efficient, cosformer, relu. Outputs in linear time as
//    o_i = a_i f_q(i) [F_k^T V] + b_i sum_j v_j, and W = Z M with z_i = [a_i f_q(i), b_i],
//    M = [F_k^T ; 1^T].
//  * the score form, w_ij = exp(l_ij - max_m l_im) / sum_m exp(l_im - max_m l_im) over the kept
//    keys, l_ij = s q_i.k_j (ScoreFamily): softmax. No features, no linear-time outputs; its rows
//    come explicit (a block of logits turned into rows), exact in double row by row, and in float
//    for searches that bound their error.
// A family is of one form (form()), and hands it out (kernel() or score()); callers ask the form
// for its rows and never test which family they hold.
//
// Adding a family: one file lib/src/families/<name>.cpp defining `family_<name>()` (the build
// lists that folder; see docs/attention.md "Adding a family"), one plain-loop reference
// lib/src/reference/families/<name>.cpp, and one entry in docs/attention.md.
#pragma once

#include "attnscope/layout.hpp"

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace attnscope {

struct Variant;
class KernelFamily;
class ScoreFamily;
enum class Convention;

/// One head's model data beyond q, k and v that a family's formula needs, as the model computed
/// it (docs/dump-format.md "Family parameters"): named matrices, e.g. rope_cos and rope_sin
/// (tokens x head_dim/2), feature_scale and exponent (1 x head_dim), agent_bias (agents x
/// tokens), token_bias (tokens x agents) and the image's agents (agents x head_dim). Whoever reads
/// them (the dump loop, a test) binds them to a Variant (Variant::params); the family asks for
/// what it needs by name (AttentionFamily::params()).
struct FamilyParams {
  std::map<std::string, MatD, std::less<>> values;
};

/// The parameter `name` bound to v, with `rows` x `cols` (each checked where >= 0). UsageError
/// naming the variant, the parameter and where a dump keeps it when none is bound, or naming the
/// expected and found shapes.
[[nodiscard]] const MatD& family_param(const Variant& v, std::string_view name, Eigen::Index rows,
                                       Eigen::Index cols);

/// How a spec's map slot is used: none allowed, required, or defaulted.
enum class MapRule { None, Required, Defaulted };

/// The laws a magnitude sweep (one query scaled by a > 0) is checked against (MALA §3.2-3.3).
enum class MagnitudeLaw { SoftmaxPower, LinearInvariant, InlineAffine, MalaRatio, MalaBetaGamma };

/// The form of a family's weights (family.hpp's header comment): which of kernel() and score() it
/// hands out.
enum class Form { Kernel, Score };

/// Relative threshold under which a normalising denominator counts as zero.
inline constexpr double kTinyDenominator = 1e-12;

class AttentionFamily {
 public:
  virtual ~AttentionFamily() = default;
  /// Spec name ("softmax", "linear", ...).
  [[nodiscard]] virtual std::string_view name() const = 0;
  /// The weight of key j for query i, one line, with its source.
  [[nodiscard]] virtual std::string_view formula() const = 0;
  [[nodiscard]] virtual MapRule map_rule() const = 0;
  /// The map used when the spec names none (MapRule::Defaulted).
  [[nodiscard]] virtual std::string_view default_map() const { return {}; }
  /// Whether this build computes `v`; when not, `why` says why. Default: every convention but
  /// code+rope (reserved).
  [[nodiscard]] virtual bool supports(const Variant& v, std::string* why) const;
  /// Whether rows are guaranteed to sum to 1 (over the kept keys under a mask).
  [[nodiscard]] virtual bool rows_sum_to_one(const Variant& v) const;
  /// Whether weights depend on token positions (not only on the queries and keys as sets).
  [[nodiscard]] virtual bool position_dependent() const { return false; }
  /// Whether weights can be negative whatever the feature map (the weight census walks these
  /// families by default). False for linear attention, whose weights are non-negative with its
  /// non-negative maps; with a signed map (linear:identity, linear:leaky_relu) they can be
  /// negative, and the census counts them when the variant is named with --variant.
  [[nodiscard]] virtual bool weights_can_be_negative() const { return false; }
  /// The laws a magnitude sweep checks: in feature space for kernel families (f_q scaled), in
  /// query space for softmax.
  [[nodiscard]] virtual std::vector<MagnitudeLaw> magnitude_laws() const = 0;
  /// The kernel form, or null (a score family).
  [[nodiscard]] virtual const KernelFamily* kernel() const { return nullptr; }
  /// The score form, or null (a kernel family).
  [[nodiscard]] virtual const ScoreFamily* score() const { return nullptr; }
  /// Which of the two the family is.
  [[nodiscard]] Form form() const { return kernel() ? Form::Kernel : Form::Score; }
  /// Names of the per-layer model data variant v's formula needs beyond q and k
  /// (FamilyParams: "rope_cos", "agents", ...); empty for families computed from q and k alone.
  /// A variant of such a family computes only with them bound (Variant::params).
  [[nodiscard]] virtual std::vector<std::string_view> params(const Variant& /*v*/) const { return {}; }
  /// Where a head of the family computes several row maps (PolaFormer's same- and opposite-sign
  /// maps), their names: the spec's map slot picks one ("polaformer:opposite"), the first by
  /// default. Empty: one map.
  [[nodiscard]] virtual std::vector<std::string_view> parts() const { return {}; }
  /// The value channels [first, first + count) of dv that variant v's map weighs in the model's
  /// output (PolaFormer: the first ceil(dv/2) for the same-sign map). Default: all of them.
  [[nodiscard]] virtual std::pair<int, int> output_columns(const Variant& v, int dv) const;
  /// The family and convention that compute this family's convention c when another family does
  /// (mala's code+rope, the released code's RoPE form, is mala_rope@code): parse_variant hands
  /// such a spec over. Default: none.
  [[nodiscard]] virtual std::optional<std::pair<const AttentionFamily*, Convention>> convention_family(
      Convention /*c*/) const {
    return std::nullopt;
  }
};

/// a_i, b_i of one row of the kernel form, or a degenerate row (weights and outputs 0, reported).
struct RowForm {
  double a = 0.0;
  double b = 0.0;
  bool degenerate = true;
};

/// Token positions of a block of query rows: row r is token first + r * step.
struct TokenPositions {
  Eigen::Index first = 0;
  Eigen::Index step = 1;
  [[nodiscard]] Eigen::Index at(Eigen::Index r) const { return first + r * step; }
};

class KernelFamily : public AttentionFamily {
 public:
  [[nodiscard]] const KernelFamily* kernel() const override { return this; }
  /// Width r of f_q and f_k for head dim d. Default: the map's output width.
  [[nodiscard]] virtual int feature_dim(const Variant& v, int d) const;
  /// Query features f_q (q.rows() x feature_dim), in double, with the convention's factor; the
  /// model's N is `n_keys`. Default: c phi(q), c = feature_factor().
  virtual void query_features(const Variant& v, ConstRef<double> q, TokenPositions positions,
                              Eigen::Index n_keys, double scale, Eigen::Ref<MatD> out) const;
  /// Key features f_k of all N keys (row j is token j); `q` holds every query of the head (RALA
  /// re-weights its keys by the mean query; other families ignore it). Default: c phi(k).
  virtual void key_features(const Variant& v, ConstRef<double> q, ConstRef<double> k, double scale,
                            Eigen::Ref<MatD> out) const;
  /// Whether S_i, the input of the row form, comes from normaliser features of its own
  /// (S_i = g_q(i).sum_kept g_k), not from f_q and f_k: RoPE in the numerator only (MLLA, RALA,
  /// MALA's released form). The weights stay a_i f_q(i).f_k(j) + b_i, so the linear-time outputs
  /// and the low-rank form are unchanged; only S_i and its magnitude |g_q(i)| |sum g_k| differ.
  [[nodiscard]] virtual bool separate_normaliser(const Variant& /*v*/) const { return false; }
  /// Width of g_q and g_k (separate_normaliser). Default: feature_dim.
  [[nodiscard]] virtual int normaliser_dim(const Variant& v, int d) const { return feature_dim(v, d); }
  /// g_q of query rows at `positions` and g_k of all keys (separate_normaliser). Defaults: f_q, f_k.
  virtual void normaliser_query_features(const Variant& v, ConstRef<double> q, TokenPositions positions,
                                         Eigen::Index n_keys, double scale, Eigen::Ref<MatD> out) const {
    query_features(v, q, positions, n_keys, scale, out);
  }
  virtual void normaliser_key_features(const Variant& v, ConstRef<double> q, ConstRef<double> k,
                                       double scale, Eigen::Ref<MatD> out) const {
    key_features(v, q, k, scale, out);
  }
  /// The convention's factor on phi used by the default features: 1 (paper), (s/N)^1/2 (code).
  [[nodiscard]] virtual double feature_factor(const Variant& v, double scale, Eigen::Index n_keys) const;
  /// a_i, b_i from S = f_q(i).sum_kept f_k, the kept count and magnitude = |f_q(i)| |sum_kept f_k|
  /// (finite: the caller refuses overflow first).
  [[nodiscard]] virtual RowForm row_form(double S, int n_kept, double magnitude) const = 0;
  /// The row form of variant v, for families whose conventions differ in it (e.g. a denominator
  /// eps of the released code). Default: row_form(S, n_kept, magnitude) in every convention.
  [[nodiscard]] virtual RowForm variant_row_form(const Variant& v, double S, int n_kept,
                                                 double magnitude) const;
  /// Whether b_i can be non-zero: the low-rank form then carries the constant column.
  [[nodiscard]] virtual bool has_offset() const = 0;
  /// Whether f_q(a q) = a f_q(q) for every a > 0 (query-space magnitude sweeps). Default: the
  /// map's positive homogeneity.
  [[nodiscard]] virtual bool query_features_homogeneous(const Variant& v) const;
};

/// The score form: rows of exponentials of the scaled logits l_ij = s q_i.k_j, max-shifted, over
/// their row sums (family.hpp's header comment). Each operation defines its bits once; callers
/// (the engine, the exact counts, the searches) use these and nothing else.
class ScoreFamily : public AttentionFamily {
 public:
  [[nodiscard]] const ScoreFamily* score() const override { return this; }
  /// Turns w, rows r0.. of q k^T (unscaled), into rows over the keys `mask` keeps (all when
  /// null), with the max subtracted before exp. Rows that keep no key are zeroed and appended to
  /// `degenerate`.
  virtual void rows(Eigen::Ref<MatD> w, Eigen::Index r0, double scale, const Mask* mask,
                    std::vector<int>& degenerate) const = 0;
  /// The exact row of query qi (d entries) against k (n x d, row-major): logits summed in index
  /// order, the max subtracted, exp, divided by the sum. Every exact count of the form is defined
  /// by this one function.
  virtual void exact_row(const double* qi, const double* k, int n, int d, double scale, double* out) const = 0;
  /// k (n x d, row-major) widened to double and transposed into kt (d x n, row-major): the keys'
  /// layout for exact_row_t.
  virtual void transpose_keys(const MatF& k, MatD& kt) const = 0;
  /// exact_row with the keys transposed (transpose_keys): the same bits, operation for operation.
  virtual void exact_row_t(const double* qi, const double* kt, int n, int d, double scale, double* out) const = 0;
  /// Float rows of q (Nq x d) against k (Nk x d): an approximation for searches that bound its
  /// error (the logit error bound of confusion_search.hpp), never a result.
  virtual void rows_float(Eigen::Ref<const MatF> q, Eigen::Ref<const MatF> k, double scale, MatF& w) const = 0;
  /// rows_float before its last step, for callers that need a few entries of each row: rows_float's
  /// w_ij is e_ij * row_factor[i] (a float product), bit for bit.
  virtual void rows_float_factored(Eigen::Ref<const MatF> q, Eigen::Ref<const MatF> k, double scale, MatF& e,
                                   std::vector<float>& row_factor) const = 0;
  /// One head's outputs for a forward pass: out (rows x dv, row stride ldo) = W V for the query
  /// rows [0, rows) of q against the n keys, over the keys `mask` keeps (rows x n; null: all),
  /// bit for bit row i of attention_outputs<double>; rows that keep no key are zero and appended to
  /// `degenerate` when given (attention_heads.hpp). Does not check that the outputs are finite.
  virtual void head_outputs(const double* q, Eigen::Index ldq, Eigen::Index rows, const double* k,
                            Eigen::Index ldk, const double* v, Eigen::Index ldv, Eigen::Index n, Eigen::Index d,
                            Eigen::Index dv, double scale, const Mask* mask, double* out, Eigen::Index ldo,
                            std::vector<int>* degenerate) const = 0;
  /// The same outputs in float, no mask (replay --attention float; attention_heads.hpp): false,
  /// having written nothing, where float cannot hold the head (the caller then takes
  /// head_outputs).
  [[nodiscard]] virtual bool head_outputs_float(const double* q, Eigen::Index ldq, Eigen::Index rows,
                                                const double* k, Eigen::Index ldk, const double* v,
                                                Eigen::Index ldv, Eigen::Index n, Eigen::Index d,
                                                Eigen::Index dv, double scale, double* out,
                                                Eigen::Index ldo) const = 0;
  /// Whether this family's rows are softmax's: exp of the max-shifted scaled logits over their row
  /// sums. The fast paths that compute that form themselves take a score family only when it
  /// answers true: the GPU kernels (lib/cuda/weights.cuh's softmax_rows, with
  /// candidate_margin.hpp's row_bound_softmax; gpu/attention.hpp's score_rows_on_gpu refuses the
  /// others) and the diagnostics' float rows (analyses/src/float_softmax_rows.hpp; the others take
  /// the family's own double rows).
  [[nodiscard]] virtual bool rows_are_softmax() const = 0;
};

/// The row form of normalised kernels (linear attention, efficient, cosformer): a = 1/S, b = 0;
/// degenerate when S is zero or below kTinyDenominator * magnitude.
[[nodiscard]] RowForm normalised_row(double S, int n_kept, double magnitude);

/// The family's shortest spec that names a variant: its name, with ":relu" where it requires a
/// map ("softmax", "linear:relu", "mala"); what verify and the generic tests run by default.
[[nodiscard]] std::string example_spec(const AttentionFamily& family);

/// Every family of this build, in a fixed order.
[[nodiscard]] const std::vector<const AttentionFamily*>& all_families();
/// The family of that spec name, or null where none has it.
[[nodiscard]] const AttentionFamily* family_named(std::string_view name);
/// The family of that spec name; UsageError listing the known ones otherwise.
[[nodiscard]] const AttentionFamily& find_family(std::string_view name);
/// "softmax, linear, ..." for messages.
[[nodiscard]] std::string known_families();

}  // namespace attnscope
