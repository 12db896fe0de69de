// Library-internal pieces shared by the linear families' weights, outputs and low-rank form.
//
// Every linear family gives row i the affine form  w_ij = a_i phi(q_i).phi(k_j) + b_i  over the
// kept keys, with S_i = phi(q_i).sum_kept phi(k) and n_i kept keys:
//   linear  a = 1/S          b = 0
//   inline  a = 1            b = (1 - S)/n          (eq. 4)
//   mala    a = 1 + 1/S      b = -S/n               (eq. 8-9: beta and -gamma)
// so outputs are o_i = a_i phi(q_i) [sum_j phi(k_j) v_j^T] + b_i sum_j v_j (eq. 5, eq. 13).
#pragma once

#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"

#include <cmath>
#include <string>

namespace attnscope::detail {

struct RowNorm {
  double a = 0.0;
  double b = 0.0;
  bool degenerate = true;  ///< row must be zeroed and reported
};

/// `magnitude` = |phi(q_i)| |sum_kept phi(k)|, the scale that S is compared against.
/// Throws NumericalError when S or magnitude overflowed: the tiny rule would then call the row
/// degenerate, a silent wrong answer.
inline RowNorm row_norm(Family family, double S, int n_kept, double magnitude) {
  if (n_kept == 0) return {};
  if (!std::isfinite(S) || !std::isfinite(magnitude)) {
    throw NumericalError(to_string(family) + ": phi(q).sum phi(k) or its scale |phi(q)| |sum phi(k)| "
                         "overflows double");
  }
  const bool tiny = !(std::abs(S) > kTinyDenominator * magnitude);  // also catches S == 0
  const double n = static_cast<double>(n_kept);
  switch (family) {
    case Family::Linear:
      if (tiny) return {};
      return {1.0 / S, 0.0, false};
    case Family::InLine:
      return {1.0, (1.0 - S) / n, false};
    case Family::Mala:
      if (tiny) return {};
      return {1.0 + 1.0 / S, -S / n, false};
    case Family::Softmax:
      break;
  }
  throw UsageError("row_norm: softmax has no affine row form");
}

/// phi(Q) and phi(K) with the convention's factor (the model's N = number of keys).
struct Features {
  MatD q;
  MatD k;
};

/// Throws UsageError when the variant is not supported or the shapes do not fit.
void check_inputs(const Variant& v, Eigen::Index q_rows, Eigen::Index q_cols, Eigen::Index k_rows,
                  Eigen::Index k_cols, const Mask* mask);

Features features(const Variant& v, ConstRef<double> q, ConstRef<double> k, double scale);

}  // namespace attnscope::detail
