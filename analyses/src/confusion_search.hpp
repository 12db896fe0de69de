// Internal pieces of the confusion search: the exact pair judge, the per-thread workspace and the
// two candidate searches.
#pragma once

#include "attnscope/analyses/confusion.hpp"

#include <array>
#include <functional>
#include <utility>
#include <vector>

namespace attnscope::analyses::detail {

/// squared_distance's arithmetic on any element type: each element is converted to double
/// (exactly, for float) before the difference, so float inputs give the same sum as their
/// double copies would.
template <typename T>
double squared_distance_of(const T* a, const T* b, int n) {
  double s = 0.0;
  for (int t = 0; t < n; ++t) {
    const double diff = static_cast<double>(a[t]) - static_cast<double>(b[t]);
    s += diff * diff;
  }
  return s;
}

/// Decides pairs with the arithmetic of confusion.hpp. Rows are computed on first use only and
/// cached; the cache and its index live as long as the judge, so one judge per thread serves
/// every head without allocating again (reset() prepares it for the next head). A pair with an
/// excluded token (the head's image's, given to reset()) is never confused: the one place every
/// search, the degenerate pairs and the GPU path's judging ask.
class PairJudge {
 public:
  /// Writes exact row i (N entries) to out.
  using RowFn = std::function<void(int i, double* out)>;

  /// `queries` rows of `keys` entries each; q_raw has one row per query; excluded: one entry per
  /// query, or null or empty for none (kept by pointer: it must outlive the head's judging).
  void reset(int queries, int keys, const MatF& q_raw, const ConfusionOptions& opt, RowFn row,
             const ExcludedTokens* excluded = nullptr);
  /// Token i is left out of every pair.
  [[nodiscard]] bool excluded(int i) const {
    return excluded_ != nullptr && (*excluded_)[static_cast<std::size_t>(i)] != 0;
  }
  /// Neither token is excluded and the raw queries are further apart than query_eps: the pair
  /// is confused exactly when its rows are within eps.
  [[nodiscard]] bool eligible(int i, int j) const {
    return !excluded(i) && !excluded(j) && queries_differ(i, j);
  }
  /// Raw queries further apart than query_eps.
  [[nodiscard]] bool queries_differ(int i, int j) const;
  /// Exact rows within eps.
  [[nodiscard]] bool rows_within(int i, int j);
  [[nodiscard]] bool confused(int i, int j) { return eligible(i, j) && rows_within(i, j); }
  [[nodiscard]] double eps() const { return eps_; }
  [[nodiscard]] double eps2() const { return eps2_; }

 private:
  std::size_t slot(int i);
  RowFn row_;
  const MatF* q_raw_ = nullptr;
  const ExcludedTokens* excluded_ = nullptr;  // null: none
  int n_ = 0, used_ = 0;  // n_: row length (keys)
  double eps_ = 0.0, eps2_ = 0.0, query_eps2_ = 0.0;
  std::vector<int> slot_;      // row i -> its place in pool_, or -1
  std::vector<double> pool_;   // computed rows, N entries each; capacity kept across heads
};

/// Buffers of the score-form search, reused across heads by one thread (no per-head allocation once
/// the largest head has been seen; every buffer is fully overwritten before it is read).
struct ScoreWorkspace {
  MatF w;                       // float rows
  MatD wd;                      // exact double rows, when the head is outside the float range
  bool double_rows = false;     // this head's rows are in wd (the judge copies them from there)
  std::vector<double> q_norm;   // |q_i| in double
  MatD dist;                    // N x pivots
  std::vector<double> to_pivot; // squared distances to the pivot being added
  std::vector<float> to_pivot_float;  // the same summed in float (float_pivots)
  bool float_pivots = false;    // this head's pivot distances are summed in float
  std::array<double, 4> pivot_slack{};  // what float sums add to each pivot's comparisons
  VecD nearest;
  std::vector<double> rho;
  std::vector<Eigen::Index> pivots;
  std::vector<std::pair<double, Eigen::Index>> keyed;  // first-pivot distance, row; sorted
  MatD sorted_dist;             // dist's rows in sorted order
  std::vector<double> sorted_rho;
  MatD kt;                      // keys in double, transposed (d x N), for the exact rows
  std::vector<double> qi;       // one query in double
};

/// A score family's float rows (ScoreFamily::rows_float, family.hpp) are a filter, not a result:
/// only for heads that float_rows_fit() accepts. ExactRows::row and the fast search both take exact
/// rows from the family's exact_row (the search from exact_row_t, the same bits with the keys
/// transposed), so their rows agree bit for bit.

/// Largest value of (d + 6) 2^-24 |s| |q_i| max_j |k_j| (the float logits' absolute error bound)
/// under which a score-form head is computed in float: above it the float rows are replaced by the
/// exact double rows (they could overflow, and their error bound would make the float filter
/// useless anyway). On real dumps the bound is below 1e-2.
inline constexpr double kFloatLogitErrorLimit = 1.0 / 16.0;

/// What summing the pivot distances of rows of length n in float adds to every comparison of
/// two rows' distances to one pivot, given the largest float-summed distance `farthest` of that
/// pivot's column: 2 kappa / (1 - kappa) farthest + 2 sqrt(n 2^-149), kappa = gamma_(n+2) + 2^-50
/// (confusion_softmax.cpp's margin argument), rounded up.
double float_pivot_slack(Eigen::Index n, double farthest);

/// The float logits' absolute error bound for a query of norm q_norm against keys of largest
/// norm k_max: |s| (q_norm k_max (d + 6) 2^-24 + d 2^-149) (dot product, scaling, the max
/// subtraction; the last term covers products that underflow).
double logit_error(double scale, double q_norm, double k_max, Eigen::Index d);

/// Whether the float rows of a score-form head are finite and accurate (see the limit above; also
/// false for a scale that is not a normal float). Throws NumericalError when q or k holds a
/// non-finite value. Fills q_norm with |q_i| (double) and sets k_max = max_j |k_j|.
bool float_rows_fit(Eigen::Ref<const MatF> q, Eigen::Ref<const MatF> k, double scale,
                    std::vector<double>& q_norm, double& k_max);

/// The low-rank form of a kernel-family head, centred: W_ij = z_i . m_j + 1/N with m_j the
/// j-th centred key feature f_k(j) - mean f_k. Every row sums to 1, so z_i = a_i f_q(i) (a_i of
/// the family's RowForm: the b_i term and the mean fold into 1/N), the algebra of
/// attention.hpp's LowRankForm with the constant column folded into 1/N. Centring keeps M M^T free of the large common-mean direction, which
/// would otherwise swamp the small row differences in rounding. Degenerate rows hold zeros.
/// Variants whose rows need not sum to 1 (Variant::rows_sum_to_one() false) keep each row's
/// constant: z_i = [a_i f_q(i), e_i] with e_i = (row sum)/N = a_i f_q(i).sum f_k / N + b_i,
/// m_j = [f_k(j) - mean f_k ; 1] and offset 0; the rows are used as they are, never renormalised.
struct LowRank {
  MatD z;  ///< N x d' (N x (d' + 1) where rows need not sum to 1)
  MatD m;  ///< d' x N (or (d' + 1) x N)
  double offset = 0.0;  ///< 1/N where rows sum to 1, else 0; added to every entry
};
LowRank build_low_rank(const ExactRows& rows);

/// Pairs i < j of degenerate rows whose raw queries differ, decided as PairJudge::queries_differ
/// decides them (confusion.hpp's degenerate pairs); rows the judge excludes take part in none.
std::int64_t count_degenerate_pairs(const ExactRows& rows, const MatF& q_raw, double query_eps,
                                    const PairJudge& judge);

/// The score form (softmax): the family's float rows, pivot lower bounds with a float-error
/// margin, exact re-check. Heads
/// outside the float range (float_rows_fit) use the exact double rows instead, computed here
/// into ws.wd (ws.double_rows is set before the judge is first asked). q is Nq x d, k is Nk x d:
/// rows have Nk entries. The judge must already be reset for this head.
HeadConfusion search_scores(const ScoreFamily& family, const MatF& q, const MatF& k, double scale,
                            PairJudge& judge, ScoreWorkspace& ws);
/// Kernel families: radius search on y_i = z_i L with M M^T = L L^T, exact re-check of the
/// pairs whose low-rank distance is within its error bound of the threshold.
HeadConfusion search_low_rank(const ExactRows& rows, PairJudge& judge);

}  // namespace attnscope::analyses::detail
