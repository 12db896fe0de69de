// Pieces shared by the proposition checks: portable random draws, trial shapes, ranks, one
// attention row through the library, and keys confined to a hyperplane.
#pragma once

#include "attnscope/analyses/propositions.hpp"
#include "attnscope/layout.hpp"
#include "attnscope/variant.hpp"

#include <cmath>
#include <cstdint>
#include <random>
#include <limits>
#include <optional>
#include <string>

namespace attnscope::analyses::detail {

/// Seeded draws that are the same on every platform: the standard distributions are not, so
/// normals come from Box-Muller on std::mt19937_64's raw output.
class Draws {
 public:
  explicit Draws(std::uint64_t seed) : gen_(seed) {}
  /// Uniform in (0, 1].
  double unit() { return static_cast<double>((gen_() >> 11) + 1) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * unit(); }
  double normal();
  MatD matrix(Eigen::Index rows, Eigen::Index cols, double sigma = 1.0);
  VecD vector(Eigen::Index n, double sigma = 1.0);

 private:
  std::mt19937_64 gen_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

/// Independent seeds for the checks of one run.
std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t salt);

/// Trial shapes: N > d, from tiny to DeiT-like, so that both rank conditions can hold.
struct Shape {
  int n = 0;
  int d = 0;
};
/// The shape of a trial; shapes narrower than min_dim are passed over.
Shape trial_shape(int trial, int min_dim = 1);

/// Numerical rank (column-pivoting QR with Eigen's default threshold).
int numerical_rank(const MatD& m);
/// rank(K) == d and rank([K, 1]) == d + 1 (InLine Prop. 1 and 3).
bool rank_conditions(const MatD& k);

/// The model's scale for width d.
inline double default_scale(int d) { return 1.0 / std::sqrt(static_cast<double>(d)); }

/// Rows of the variant's weights for query rows x (m x d) against keys k (N x d). Sets
/// `degenerate` when any row was degenerate (zeroed by the library).
MatD weight_rows(const Variant& v, const MatD& x, const MatD& k, double scale,
                 bool* degenerate = nullptr);
/// The row of one query.
VecD weight_row(const Variant& v, const VecD& x, const MatD& k, double scale,
                bool* degenerate = nullptr);

/// n keys on the hyperplane {k : k.x0 = 1} for a random x0 (returned), spread in its other
/// directions: K x0 = 1 is solvable, so rank([K, 1]) = rank(K) = d.
MatD hyperplane_keys(Draws& draws, int n, int d, VecD* x0);

/// Right singular vector of m for its smallest singular value (unit length).
VecD weakest_direction(const MatD& m);

/// Starts a row with the margin at the identity of its fold (+inf for Above, 0 for Below).
CheckRow start_row(std::string check, std::string what, double threshold, CheckRow::Sense sense);
/// Folds one value into the row's margin (min for Above, max for Below; NaN poisons). Trials are
/// counted by the caller.
void fold(CheckRow& row, double value);

/// Runs `trials` trials of a check: trial(t) returns the value folded into the row's margin.
/// Counts the trials and decides the row.
template <typename Trial>
CheckRow run_trials(CheckRow row, int trials, Trial&& trial) {
  for (int t = 0; t < trials; ++t) {
    fold(row, trial(t));
    ++row.trials;
  }
  row.decide();
  return row;
}

/// The value of the first of up to `max_draws` draws that is usable (draw(attempt) returns
/// nullopt for a degenerate one, e.g. a query that ReLU kills), or +inf when none was: a check
/// that never got a usable draw must not pass quietly.
template <typename Draw>
double first_usable(int max_draws, Draw&& draw) {
  for (int attempt = 0; attempt < max_draws; ++attempt) {
    if (const std::optional<double> v = draw(attempt)) return *v;
  }
  return std::numeric_limits<double>::infinity();
}

}  // namespace attnscope::analyses::detail
