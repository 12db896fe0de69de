// Pieces shared by the proposition checks: portable random draws, trial shapes, ranks, one
// attention row through the library, and keys confined to a hyperplane.
#pragma once

#include "attnscope/analyses/propositions.hpp"
#include "attnscope/layout.hpp"
#include "attnscope/variant.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
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
  /// 64 raw bits (a seed for an input generator of CheckInputs).
  std::uint64_t bits() { return gen_(); }
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

/// Rows of the variant's weights for query rows x (m x d) against keys k (N x d), through
/// in.weights when set, else the library. Sets `degenerate` when any row was degenerate (zeroed
/// by the library).
MatD weight_rows(const CheckInputs& in, const Variant& v, const MatD& x, const MatD& k,
                 double scale, bool* degenerate = nullptr);
/// The row of one query.
VecD weight_row(const CheckInputs& in, const Variant& v, const VecD& x, const MatD& k, double scale,
                bool* degenerate = nullptr);

/// The check's variant "<family><rest>" with in.family in place of `family` when set (softmax
/// takes no map: its rest is dropped).
Variant check_variant(const CheckInputs& in, const std::string& family, const std::string& rest);

/// Keys of one draw: in.keys when set, else Gaussian.
MatD draw_keys(Draws& draws, const CheckInputs& in, int n, int d);

/// Solution x of K x = 1 (least squares when it has none).
VecD solve_ones(const MatD& k);

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

/// Counts one trial: folds its value, or counts it unusable when it has none.
void count_trial(CheckRow& row, const std::optional<double>& value);
/// Decides the row; a row without a usable trial gets a NaN margin (nothing was measured).
void finish(CheckRow& row);

/// Runs `trials` trials of a check: trial(t) returns the value folded into the row's margin, or
/// nullopt when the trial had no usable draw. Counts the trials and decides the row.
template <typename Trial>
CheckRow run_trials(CheckRow row, int trials, Trial&& trial) {
  for (int t = 0; t < trials; ++t) count_trial(row, trial(t));
  finish(row);
  return row;
}

/// How many redraws a trial may take to meet its hypothesis before it counts as unusable.
inline constexpr int kMaxRedraws = 100;

/// The result of the first of up to `max_draws` draws that is usable (draw(attempt) returns
/// nullopt for one that is not, e.g. a query that ReLU kills or keys that miss the rank
/// conditions), or nullopt when none was: the trial is then reported as unusable, never as a
/// margin.
template <typename Draw>
auto first_usable(int max_draws, Draw&& draw) -> decltype(draw(0)) {
  for (int attempt = 0; attempt < max_draws; ++attempt) {
    if (auto v = draw(attempt)) return v;
  }
  return std::nullopt;
}

}  // namespace attnscope::analyses::detail
