// Plain-loop helpers of the references that take per-layer model data (reference.hpp, "families
// of the field"): the ELU+1 map, the Variant entry that refuses, and the check of a layer's
// parameter shapes. Nothing here knows a family's formula.
#pragma once

#include "support.hpp"

#include "attnscope/error.hpp"

#include <string>

namespace attnscope::reference::field {

/// ELU(x) + 1 entry by entry (the feature map of MLLA, RALA and MALA).
inline MatD elu1(const MatD& x) {
  MatD y(x.rows(), x.cols());
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    for (Eigen::Index t = 0; t < x.cols(); ++t)
      y(i, t) = x(i, t) > 0.0 ? x(i, t) + 1.0 : std::exp(x(i, t));
  }
  return y;
}

/// The released codes' denominator eps (1e-6 per key) in the code convention, none in the paper's.
inline double eps(Convention c) { return c == Convention::Paper ? 0.0 : 1e-6; }

/// UsageError unless `what` is rows x cols.
inline void expect_shape(const char* family, const char* what, const MatD& m, Eigen::Index rows,
                         Eigen::Index cols) {
  if (m.rows() != rows || m.cols() != cols) {
    throw UsageError(std::string(family) + ": " + what + " is " + std::to_string(m.rows()) + "x" +
                     std::to_string(m.cols()) + ", expected " + std::to_string(rows) + "x" +
                     std::to_string(cols));
  }
}

/// The Variant entry of reference::weights for a family that needs per-layer model data.
[[noreturn]] inline void needs_layer_data(const char* family, const char* what, const char* call) {
  throw UsageError(std::string("reference::weights: the ") + family + " reference needs " + what +
                   ", which a variant does not carry; call reference::" + call);
}

/// sum_j w_ij v_j for rows i of w: O = W V.
inline MatD product(const MatD& w, const MatD& v) {
  MatD out = MatD::Zero(w.rows(), v.cols());
  for (Eigen::Index i = 0; i < w.rows(); ++i) {
    for (Eigen::Index j = 0; j < w.cols(); ++j) {
      for (Eigen::Index c = 0; c < v.cols(); ++c) out(i, c) += w(i, j) * v(j, c);
    }
  }
  return out;
}

}  // namespace attnscope::reference::field

namespace attnscope::reference::field {

/// The normalised RoPE-numerator form shared by MLLA and RALA, on given features fq, fk (N x d):
/// w_ij = R fq_i . R fk_j / (sum_m fq_i . fk_m + N eps(c)). Defined in families/mlla.cpp.
MatD rope_normalised_weights(Convention c, const MatD& fq, const MatD& fk, const Rotation& rotation,
                             std::vector<int>* degenerate);
/// Its output as the released modules form it: R fq_i . (sum_j R fk_j v_j / N) / (fq_i . mean fk +
/// eps).
MatD rope_normalised_outputs(Convention c, const MatD& fq, const MatD& fk, const MatD& v,
                             const Rotation& rotation);

}  // namespace attnscope::reference::field
