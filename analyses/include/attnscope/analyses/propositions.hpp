// The theory of both papers checked by numbers: InLine's Propositions 1-3 and Lemma 1, MALA's
// eq. 9, 11, 19 and 22 (and where eq. 22's positivity assumption matters), and the agreement of
// the linear-time forms (InLine eq. 5, MALA eq. 13) with the explicit weights. Each check runs
// seeded random trials through the attention library and returns one report row.
//
// Conventions of every row: `margin` is the worst value found over the trials; a row passes when
// margin > threshold (Sense::Above: e.g. "rows of distinct queries differ by at least") or
// margin <= threshold (Sense::Below: e.g. "rows that must be equal differ by at most").
#pragma once

#include "attnscope/variant.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace attnscope::analyses {

struct CheckRow {
  enum class Sense { Above, Below };
  std::string check;  ///< id, e.g. "prop1.adversarial"
  std::string what;   ///< what was tried, one line
  long trials = 0;
  double margin = 0.0;
  double threshold = 0.0;
  Sense sense = Sense::Below;
  bool pass = false;
  /// Sets pass from margin, threshold and sense (NaN margins fail).
  void decide();
};

// Thresholds (computations in double).
inline constexpr double kDistinctRows = 1e-9;        ///< rows that must differ: at least this
inline constexpr double kEqualRows = 1e-12;          ///< rows that must agree: at most this
inline constexpr double kIdentityTolerance = 1e-12;  ///< algebraic identities, relative

/// Prop. 1 with random keys meeting the rank conditions: random pairs p != q have softmax rows at
/// least kDistinctRows apart.
CheckRow check_prop1_random(std::uint64_t seed, int trials);
/// Prop. 1 against adversarial pairs q = p + t x, x the least-squares solution of K x = 1 and the
/// weakest direction of the softmax Jacobian: |S(p) - S(q)| / |p - q| stays above kDistinctRows.
CheckRow check_prop1_adversarial(std::uint64_t seed, int trials);
/// The converse: keys on a hyperplane (K x = 1 solvable, rank([K, 1]) = d) give p != q with
/// identical softmax rows (q = p + t x).
CheckRow check_prop1_hyperplane(std::uint64_t seed, int trials);

/// Prop. 2, phi = ReLU: collinear queries q = c p (c > 0, c != 1) get identical linear rows.
CheckRow check_prop2_relu_collinear(std::uint64_t seed, int trials);
/// Prop. 2, phi = identity: q = -p gets the row of p.
CheckRow check_prop2_identity_negation(std::uint64_t seed, int trials);
/// Prop. 2, phi = ReLU(A x + b): queries of distinct directions built so that
/// phi(q) = c phi(p) (A q + b moves only where ReLU is zero, and by c elsewhere).
CheckRow check_prop2_relu_affine(std::uint64_t seed, int trials);
/// Lemma 1 for an injective map ("leaky_relu" or "elu1"): for alpha != 1 a q with
/// phi(q) = alpha phi(p) is found by bisection on phi, and the linear rows of p and q agree.
CheckRow check_lemma1(const std::string& map, std::uint64_t seed, int trials);

/// Prop. 3: InLine rows of random distinct queries differ (phi identity, leaky_relu, elu1).
CheckRow check_prop3_random(std::uint64_t seed, int trials);
/// Prop. 3 on the pairs that fool linear attention (q = c p, q = -p) and on the weakest
/// direction of InLine's map: |InL(p) - InL(q)| / |p - q| stays above kDistinctRows.
CheckRow check_prop3_collinear(std::uint64_t seed, int trials);
/// The converse for InLine: keys on a hyperplane confuse it too (the rank condition matters).
CheckRow check_prop3_hyperplane(std::uint64_t seed, int trials);

/// MALA eq. 9: every row sums to 1 (paper and code conventions), relative to sum_j |w_j|.
CheckRow check_mala_rows_sum(std::uint64_t seed, int trials);
/// MALA eq. 11: scaling phi(q) by a gives beta' = (beta + a - 1)/a and gamma' = a gamma, with
/// beta and gamma read from the library's low-rank form.
CheckRow check_mala_eq11(std::uint64_t seed, int trials);
/// MALA eq. 19: a beta / (a + beta - 1) > 1 for beta > 1, a > 1 (margin: the smallest excess).
CheckRow check_mala_eq19(std::uint64_t seed, int trials);
/// MALA eq. 22: p_m > p when all weights are positive (margin: smallest (p_m - p) / p).
CheckRow check_mala_eq22(std::uint64_t seed, int trials);
/// Where eq. 22's assumption matters: a key positive at a = 1 but negative at a = 8 gives
/// p_m < p. Passes when such a counterexample is found (margin: p - p_m).
CheckRow check_mala_eq22_counterexample(std::uint64_t seed, int trials);

/// Linear-time outputs (InLine eq. 5, MALA eq. 13) equal the explicit W V, on awkward sizes
/// (N = 1, 2, 50, 197; d = 1, 7, 64); error relative to (|Z| |M|) |V| entry by entry, with
/// W = Z M the library's low-rank form: the size of the terms the linear-time form adds.
CheckRow check_linear_form(const std::string& variant, std::uint64_t seed, int trials);

/// log cost = exponent log N + log prefactor, least squares; r2 of the fit in log space.
struct PowerLawFit {
  double exponent = 0.0;
  double prefactor = 0.0;
  double r2 = 0.0;
};
PowerLawFit fit_power_law(const std::vector<double>& n, const std::vector<double>& cost);

/// Seconds per call (CPU time of the one thread that runs Eigen, best of `repeats` batches) of
/// the linear-time and explicit forms (float) over sizes.
struct FormTiming {
  std::string variant;
  int dim = 0;
  std::vector<int> sizes;
  std::vector<double> linear_s;
  std::vector<double> explicit_s;
};
FormTiming time_forms(const std::string& variant, const std::vector<int>& sizes, int dim,
                      int repeats, std::uint64_t seed);
/// Two rows: the linear form's exponent (pass at or below 1.5) and the explicit form's (above 1.6).
std::vector<CheckRow> cost_rows(const FormTiming& t);

struct VerifyOptions {
  std::uint64_t seed = 0;
  int trials = 200;
  bool timing = true;
  std::vector<int> timing_sizes{64, 128, 256, 512, 1024, 2048, 4096};
  int timing_dim = 64;
  int timing_repeats = 3;
  /// When set, receives the measured times behind the cost rows.
  std::vector<FormTiming>* timings = nullptr;
};
/// Every check above, in report order.
std::vector<CheckRow> verify_all(const VerifyOptions& opts);

}  // namespace attnscope::analyses
