// Internal pieces of the confusion search: the exact pair judge and the two candidate searches.
#pragma once

#include "attnscope/analyses/confusion.hpp"

#include <vector>

namespace attnscope::analyses::detail {

/// Decides pairs with the arithmetic of confusion.hpp. Rows are computed once and cached.
class PairJudge {
 public:
  PairJudge(const ExactRows& rows, const MatF& q_raw, const ConfusionOptions& opt);
  /// Raw queries further apart than query_eps.
  [[nodiscard]] bool queries_differ(int i, int j) const;
  /// Exact rows within eps.
  [[nodiscard]] bool rows_within(int i, int j);
  [[nodiscard]] bool confused(int i, int j) { return queries_differ(i, j) && rows_within(i, j); }
  [[nodiscard]] double eps() const { return eps_; }
  [[nodiscard]] double eps2() const { return eps2_; }

 private:
  const double* cached_row(int i);
  const ExactRows& rows_;
  MatD q_raw_;
  double eps_, eps2_, query_eps2_;
  std::vector<std::vector<double>> cache_;
};

/// Float softmax rows of one head: one GEMM and one exp per entry (a filter, not a result).
MatF softmax_rows_float(const MatF& q, const MatF& k, double scale);

/// The low-rank form W = z M of a linear-family head (attention.hpp), from ExactRows' features.
/// Rows of degenerate queries hold zeros.
struct LowRank {
  MatD z;  ///< N x r
  MatD m;  ///< r x N
};
LowRank build_low_rank(const ExactRows& rows);

/// Softmax: float rows, pivot lower bounds with a float-error margin, exact re-check.
HeadConfusion search_softmax(const MatF& q, const MatF& k, double scale, PairJudge& judge);
/// Linear, InLine, MALA: radius search on y_i = z_i L with M M^T = L L^T, exact re-check of the
/// pairs whose low-rank distance is within its error bound of the threshold.
HeadConfusion search_low_rank(const ExactRows& rows, PairJudge& judge);

}  // namespace attnscope::analyses::detail
