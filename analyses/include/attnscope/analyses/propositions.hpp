// The theory of both papers checked by numbers: InLine's Propositions 1-3 and Lemma 1, MALA's
// eq. 9, 11, 19 and 22 (and where eq. 22's positivity assumption matters), and the agreement of
// the linear-time forms (InLine eq. 5, MALA eq. 13) with the explicit weights. Each check runs
// seeded random trials through the attention library and returns one report row.
//
// Conventions of every row: `margin` is the worst value found over the usable trials; a row
// passes when margin > threshold (Sense::Above: e.g. "rows of distinct queries differ by at
// least") or margin <= threshold (Sense::Below: e.g. "rows that must be equal differ by at most").
// A trial whose draws never meet the check's hypothesis (e.g. the rank conditions), within a
// bounded number of redraws, is counted as unusable: the row then fails as "NO DRAW", never as a
// measured margin.
//
// Every check takes CheckInputs: empty members keep the check's own inputs (the proposition's
// hypotheses); a test replaces them to run the same check where the proposition is false and
// expect it to fail (a negative control).
#pragma once

#include "attnscope/layout.hpp"
#include "attnscope/variant.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace attnscope::analyses {

struct CheckRow {
  enum class Sense { Above, Below };
  std::string check;    ///< id, e.g. "prop1.adversarial"
  std::string what;     ///< what was tried, one line
  long trials = 0;      ///< trials run, usable or not
  long unusable = 0;    ///< trials without a usable draw (not measured)
  double margin = 0.0;  ///< worst over the usable trials; NaN when none was usable
  double threshold = 0.0;
  Sense sense = Sense::Below;
  bool pass = false;
  /// Sets pass: no unusable trial, at least one trial, and margin beats threshold in the row's
  /// sense (NaN margins fail).
  void decide();
  /// "PASS", "FAIL", or "NO DRAW" (failed: some trial had no usable draw, or none was run).
  [[nodiscard]] std::string result() const;
};

// Thresholds (computations in double).
inline constexpr double kDistinctRows = 1e-9;        ///< rows that must differ: at least this
inline constexpr double kEqualRows = 1e-12;          ///< rows that must agree: at most this
inline constexpr double kIdentityTolerance = 1e-12;  ///< algebraic identities, relative

/// The pieces of a check that a caller may replace. Each check documents which it reads.
struct CheckInputs {
  /// Family to run instead of the check's own (a registry name, e.g. "softmax"); the check's
  /// feature map and convention are kept (a family that takes no map keeps the convention only).
  std::string family;
  /// Keys of one draw, n x d, from a seed the check draws.
  std::function<MatD(int n, int d, std::uint64_t seed)> keys;
  /// Partner q of query p against keys k (replaces the check's construction of q).
  std::function<VecD(const VecD& p, const MatD& k)> partner;
  /// Do not test the keys against the check's hypothesis (rank conditions, hyperplane).
  bool skip_hypothesis = false;
  /// Weight rows of queries x against keys k (the library's attention_weights by default).
  std::function<MatD(const Variant& v, const MatD& x, const MatD& k, double scale)> weights;
  /// The query fed at magnitude a, from phi(q) (a phi(q) by default): MALA eq. 11.
  std::function<VecD(const VecD& phi_q, double a)> scaled_query;
  /// Range of MALA's magnitude factor a (eq. 11, 19, 22); a single value when equal.
  std::optional<std::pair<double, double>> a_range;
  /// Outputs of a form (the library's attention_outputs for linear_form and for the linear-time
  /// cost row, attention_outputs_explicit for the explicit cost row).
  std::function<MatD(const Variant& v, const MatD& q, const MatD& k, const MatD& values,
                     double scale)>
      outputs;
};

/// Prop. 1 with random keys meeting the rank conditions: random pairs p != q have softmax rows at
/// least kDistinctRows apart.
CheckRow check_prop1_random(std::uint64_t seed, int trials, const CheckInputs& in = {});
/// Prop. 1 against adversarial pairs q = p + t x, x the least-squares solution of K x = 1 and the
/// weakest direction of the softmax Jacobian: |S(p) - S(q)| / |p - q| stays above kDistinctRows.
CheckRow check_prop1_adversarial(std::uint64_t seed, int trials, const CheckInputs& in = {});
/// The converse: keys on a hyperplane (K x = 1 solvable, rank([K, 1]) = d) give p != q with
/// identical softmax rows (q = p + t x).
CheckRow check_prop1_hyperplane(std::uint64_t seed, int trials, const CheckInputs& in = {});

/// Prop. 2, phi = ReLU: collinear queries q = c p (c > 0, c != 1) get identical linear rows.
CheckRow check_prop2_relu_collinear(std::uint64_t seed, int trials, const CheckInputs& in = {});
/// Prop. 2, phi = identity: q = -p gets the row of p.
CheckRow check_prop2_identity_negation(std::uint64_t seed, int trials, const CheckInputs& in = {});
/// Prop. 2, phi = ReLU(A x + b): queries of distinct directions built so that
/// phi(q) = c phi(p) (A q + b moves only where ReLU is zero, and by c elsewhere).
CheckRow check_prop2_relu_affine(std::uint64_t seed, int trials, const CheckInputs& in = {});
/// Lemma 1 for an injective map ("leaky_relu" or "elu1"): for alpha != 1 a q with
/// phi(q) = alpha phi(p) is found by bisection on phi, and the linear rows of p and q agree.
CheckRow check_lemma1(const std::string& map, std::uint64_t seed, int trials,
                      const CheckInputs& in = {});

/// Prop. 3: InLine rows of random distinct queries differ (phi identity, leaky_relu, elu1).
CheckRow check_prop3_random(std::uint64_t seed, int trials, const CheckInputs& in = {});
/// Prop. 3 on the pairs that fool linear attention (q = c p, q = -p) and on the weakest
/// direction of InLine's map: |InL(p) - InL(q)| / |p - q| stays above kDistinctRows.
CheckRow check_prop3_collinear(std::uint64_t seed, int trials, const CheckInputs& in = {});
/// The converse for InLine: keys on a hyperplane confuse it too (the rank condition matters).
CheckRow check_prop3_hyperplane(std::uint64_t seed, int trials, const CheckInputs& in = {});

/// MALA eq. 9: every row sums to 1 (paper and code conventions), relative to sum_j |w_j|.
CheckRow check_mala_rows_sum(std::uint64_t seed, int trials, const CheckInputs& in = {});
/// MALA eq. 11: scaling phi(q) by a gives beta' = (beta + a - 1)/a and gamma' = a gamma, with
/// beta and gamma read from the library's low-rank form.
CheckRow check_mala_eq11(std::uint64_t seed, int trials, const CheckInputs& in = {});
/// MALA eq. 19 on the library's weights: each MALA row (mala:elu1@code) of phi(q) and of a phi(q),
/// a in a_range (default (1.5, 8]), is fitted as B s_j - G over its keys (s_j = phi(q).phi(k_j));
/// x = (G_a / G) / (B_a / B) is the factor eq. 12 puts on gamma, a beta / (a + beta - 1), which
/// eq. 19 says exceeds 1 (margin: the smallest x - 1).
CheckRow check_mala_eq19(std::uint64_t seed, int trials, const CheckInputs& in = {});
/// MALA eq. 22: p_m > p when all weights are positive (margin: smallest (p_m - p) / p). Reads
/// a_range (default (1, 8]) and weights.
CheckRow check_mala_eq22(std::uint64_t seed, int trials, const CheckInputs& in = {});
/// Where eq. 22's assumption matters: a key positive at a = 1 but negative at a = 8 gives
/// p_m < p. Passes when such a counterexample is found (margin: p - p_m).
CheckRow check_mala_eq22_counterexample(std::uint64_t seed, int trials, const CheckInputs& in = {});

/// The specs verify checks the linear-form identity on: every kernel family of the registry
/// (family.hpp) as example_spec() names it, paper and code.
[[nodiscard]] std::vector<std::string> linear_form_specs();
/// Linear-time outputs (InLine eq. 5, MALA eq. 13) equal the explicit W V, on awkward sizes
/// (N = 1, 2, 50, 197; d = 1, 7, 64); error relative to (|Z| |M|) |V| entry by entry, with
/// W = Z M the library's low-rank form: the size of the terms the linear-time form adds.
CheckRow check_linear_form(const std::string& variant, std::uint64_t seed, int trials,
                           const CheckInputs& in = {});

/// Deterministic cost of a form: multiply-adds counted by the library (work_counters.hpp) per
/// call over sizes N, d = dim; in.outputs replaces the form.
struct FormWork {
  std::string variant;
  std::string form;  ///< "linear_time" or "explicit"
  int dim = 0;
  std::vector<int> sizes;
  std::vector<double> multiply_adds;
  long scratch_growths_on_repeat = 0;  ///< scratch allocations of a second call of each size
};
FormWork count_form_work(const std::string& variant, bool linear_time,
                         const std::vector<int>& sizes, int dim, std::uint64_t seed,
                         const CheckInputs& in = {});
/// One row from counted work: the fitted exponent of N must be at most 1.01 for the
/// linear-time form (the count is exactly linear in N) and above 1.9 for the explicit form; the
/// linear-time row also fails when a repeated call of one size allocated scratch.
CheckRow cost_row(const FormWork& w);

/// log cost = exponent log N + log prefactor, least squares; r2 of the fit in log space.
struct PowerLawFit {
  double exponent = 0.0;
  double prefactor = 0.0;
  double r2 = 0.0;
};
PowerLawFit fit_power_law(const std::vector<double>& n, const std::vector<double>& cost);

/// Seconds per call (CPU time of the one thread that runs Eigen, best of `repeats` batches) of
/// the linear-time and explicit forms (float) over sizes. Information only: a clock measures the
/// machine (caches, malloc, load) as much as the algorithm, so no row passes or fails on it.
struct FormTiming {
  std::string variant;
  int dim = 0;
  std::vector<int> sizes;
  std::vector<double> linear_s;
  std::vector<double> explicit_s;
  PowerLawFit linear_fit;    ///< fitted to linear_s
  PowerLawFit explicit_fit;  ///< fitted to explicit_s
};
FormTiming time_forms(const std::string& variant, const std::vector<int>& sizes, int dim,
                      int repeats, std::uint64_t seed);

struct VerifyOptions {
  std::uint64_t seed = 0;
  int trials = 200;
  /// Sizes of the counted cost rows (always run: they are deterministic).
  std::vector<int> work_sizes{64, 128, 256, 512, 1024, 2048};
  int work_dim = 64;
  bool timing = true;
  std::vector<int> timing_sizes{64, 128, 256, 512, 1024, 2048, 4096};
  int timing_dim = 64;
  int timing_repeats = 3;
  /// When set, receives the measured times (information, not rows).
  std::vector<FormTiming>* timings = nullptr;
};
/// Every check above, in report order.
std::vector<CheckRow> verify_all(const VerifyOptions& opts);

}  // namespace attnscope::analyses
