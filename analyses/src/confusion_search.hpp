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

/// The low-rank form of a linear-family head, centred: W_ij = z_i . m_j + 1/N with m_j the
/// j-th centred key feature phi(k_j) - mean phi(k). Every row sums to 1, so
///   linear: z_i = phi(q_i) / den_i,  inline: z_i = phi(q_i),  mala: z_i = beta_i phi(q_i)
/// (den_i = phi(q_i).sum phi(k)), the algebra of attention.hpp's LowRankForm with the constant
/// column folded into 1/N. Centring keeps M M^T free of the large common-mean direction, which
/// would otherwise swamp the small row differences in rounding. Degenerate rows hold zeros.
struct LowRank {
  MatD z;  ///< N x d'
  MatD m;  ///< d' x N
  double offset = 0.0;  ///< 1/N, added to every entry
};
LowRank build_low_rank(const ExactRows& rows);

/// Softmax: float rows, pivot lower bounds with a float-error margin, exact re-check.
HeadConfusion search_softmax(const MatF& q, const MatF& k, double scale, PairJudge& judge);
/// Linear, InLine, MALA: radius search on y_i = z_i L with M M^T = L L^T, exact re-check of the
/// pairs whose low-rank distance is within its error bound of the threshold.
HeadConfusion search_low_rank(const ExactRows& rows, PairJudge& judge);

}  // namespace attnscope::analyses::detail
