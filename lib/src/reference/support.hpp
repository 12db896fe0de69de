// Plain-loop helpers shared by the per-family references (families/*.cpp): nothing here knows a
// family's formula.
#pragma once

#include "reference.hpp"

#include <cmath>
#include <limits>

namespace attnscope::reference::support {

inline double dot(const MatD& a, Eigen::Index i, const MatD& b, Eigen::Index j) {
  double s = 0.0;
  for (Eigen::Index t = 0; t < a.cols(); ++t) s += a(i, t) * b(j, t);
  return s;
}

inline bool kept(const Mask* mask, Eigen::Index i, Eigen::Index j) {
  return mask == nullptr || (*mask)(i, j);
}

/// Number of keys query i keeps.
inline int kept_count(const Mask* mask, Eigen::Index i, Eigen::Index n_keys) {
  int n = 0;
  for (Eigen::Index j = 0; j < n_keys; ++j) n += kept(mask, i, j) ? 1 : 0;
  return n;
}

/// S_i = sum over kept keys m of fq_i . fk_m.
inline double kept_score_sum(const MatD& fq, const MatD& fk, const Mask* mask, Eigen::Index i) {
  double S = 0.0;
  for (Eigen::Index m = 0; m < fk.rows(); ++m) S += kept(mask, i, m) ? dot(fq, i, fk, m) : 0.0;
  return S;
}

/// |fq_i| |sum_kept fk|, the scale the tiny rule compares a denominator against.
inline double magnitude(const MatD& fq, const MatD& fk, const Mask* mask, Eigen::Index i) {
  double q2 = 0.0, s2 = 0.0;
  for (Eigen::Index t = 0; t < fq.cols(); ++t) {
    double ks = 0.0;
    for (Eigen::Index m = 0; m < fk.rows(); ++m) {
      if (kept(mask, i, m)) ks += fk(m, t);
    }
    s2 += ks * ks;
    q2 += fq(i, t) * fq(i, t);
  }
  return std::sqrt(q2) * std::sqrt(s2);
}

/// Whether S is zero or below kTinyDenominator * magnitude.
inline bool tiny(double S, double mag) { return !(std::abs(S) > kTinyDenominator * mag); }

/// Row i set to NaN: an overflowed row has no value in double, and NaN keeps any caller from
/// taking it for a result.
inline void poison(MatD& w, Eigen::Index i) {
  for (Eigen::Index j = 0; j < w.cols(); ++j) w(i, j) = std::numeric_limits<double>::quiet_NaN();
}

/// c phi(x): the feature map entry by entry with the convention's factor (1 paper, (s/N)^1/2 code).
inline MatD scaled_features(const Variant& v, const MatD& x, double scale, Eigen::Index n_keys) {
  const double c = v.convention == Convention::Paper ? 1.0 : std::sqrt(scale / static_cast<double>(n_keys));
  return c * feature_map(v.map, x);
}

}  // namespace attnscope::reference::support
