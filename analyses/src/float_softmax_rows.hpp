// Float softmax rows for the per-query diagnostics (distance, entropy, sinks, rollout): the
// exponentials of the scaled logits, unnormalised, with their row sums in double. One fixed-order
// float GEMM (portable::gemm_packed), the vectorised portable exp_float, sums over kLanes fixed
// lanes: the same bits on every CPU and at every thread count.
//
// Error bound (the margin argument of confusion_softmax.cpp, with the sums kept in double). With
// delta_i = |s| (|q_i| max_j |k_j| (d + 6) 2^-24 + d 2^-149) the absolute error of row i's float
// logits (dot product, scaling, max subtraction), every exponential is e~_ij = e_ij exp(eta)(1 +
// eps) with |eta| <= delta_i and |eps| < 2^-23 (exp_float errs by < 1 ulp), so |e~_ij / e_ij - 1|
// <= r_i = expm1(delta_i) + 2^-22 (the second 2^-23 covers expm1(delta) 2^-23 and the double
// sums, below n 2^-53). Any non-negative combination sum_j c_j e~_ij is then within a relative
// r_i of its exact value, and a ratio of two within 2 r_i / (1 - r_i). Exponentials below float's
// smallest normal (2^-126 of the row's largest, which is exactly 1) flush to 0: an absolute error
// under 1.2e-38 each, not a relative one. The rows are used only where delta = max_i delta_i <=
// kDiagnosticLogitError (2^-12: r_i < 2.5e-4); larger heads take the double path. The bound is
// for the worst case of every rounding; measured errors are far smaller
// (tests/unit/test_diagnostics_fast.cpp).
#pragma once

#include "attnscope/layout.hpp"
#include "attnscope/portable_math.hpp"
#include "attnscope/variant.hpp"

#include <vector>

namespace attnscope::analyses::detail {

/// Largest logit error bound delta (above) for which a head is measured in float.
inline constexpr double kDiagnosticLogitError = 1.0 / 4096.0;

/// One thread's buffers, reused from head to head (no allocation once the largest head was seen).
struct FloatSoftmaxRows {
  MatF e;                   ///< rows r0..N-1: exp(y_ij), y_ij = s q_i.k_j - max_j (float)
  MatF y;                   ///< y_ij, when asked for
  std::vector<double> sum;  ///< sum_j e_ij in double, per row of e
  std::vector<float> top;   ///< max_j of s q_i.k_j (float), per row of e
  std::vector<double> q_norm;
  portable::PackedMatrix<float> keys;
  double delta = 0.0;  ///< the largest logit error bound of the head
};

/// The calling thread's buffers.
FloatSoftmaxRows& thread_float_softmax_rows();

/// Whether v's rows are those these float rows compute, as its family says
/// (ScoreFamily::rows_are_softmax), and v is supported: the diagnostics take their float path only
/// then, and the family's own double rows otherwise.
bool takes_float_softmax(const Variant& v);

/// Fills ws for the rows r0.. of q (N x d) against k (N x d) with the head's scale, y too with
/// keep_logits. False (nothing filled) when the head is outside the float range: delta above
/// kDiagnosticLogitError or a scale that is not a normal float. NumericalError for a non-finite
/// q or k.
bool float_softmax_rows(const MatF& q, const MatF& k, double scale, Eigen::Index r0,
                        bool keep_logits, FloatSoftmaxRows& ws);

/// r = expm1(delta) + 2^-22: the relative error bound of every exponential of a head whose logit
/// error bound is delta, and of any non-negative combination of a row's exponentials.
double exp_relative_error(double delta);

/// 2 r / (1 - r), r = exp_relative_error(delta): the relative error bound of a float weight, or of
/// any ratio of non-negative combinations of a row's exponentials.
double relative_weight_error(double delta);

/// Row i's softmax weights as float_softmax_weights makes them: w(j) = e_ij times the reciprocal
/// of the row's sum, in double (one more rounding, far below the float bound: a division per
/// weight would cost as much as the exponentials).
struct FloatWeightRow {
  const float* e;
  double inv;
  double operator()(Eigen::Index j) const { return static_cast<double>(e[j]) * inv; }
};
/// The same from exponentials e and their row sums kept apart from the thread's buffers.
inline FloatWeightRow weight_row(const MatF& e, const std::vector<double>& sum, Eigen::Index i) {
  return {e.row(i).data(), 1.0 / sum[static_cast<std::size_t>(i)]};
}
inline FloatWeightRow weight_row(const FloatSoftmaxRows& ws, Eigen::Index i) {
  return weight_row(ws.e, ws.sum, i);
}

/// Row i of N x N double weights in weight_row's form (a functor of the column j), for the code
/// that takes either kind of row.
inline auto double_row(const MatD& w, Eigen::Index i) {
  const double* row = w.row(i).data();
  return [row](Eigen::Index j) { return row[j]; };
}

/// Every row's weight_row into w (N x N, double).
void widen_weights(const MatF& e, const std::vector<double>& sum, MatD& w);

/// The head's softmax weights e_ij / sum_j e_ij of every row (N x N, widened to double), from
/// float_softmax_rows: each within a relative 2 r / (1 - r) of the exact weight. False (w
/// untouched) where float_softmax_rows is.
bool float_softmax_weights(const MatF& q, const MatF& k, double scale, MatD& w);

}  // namespace attnscope::analyses::detail
