// Reference: MLLA's linear attention as LeapLabTHU/MLLA models/mlla.py computes it. q, k after
// ELU+1 (phi); the numerator rotated by the layer's 2-D RoPE, the denominator not:
//   w_ij = R phi(q_i) . R phi(k_j) / (sum_m phi(q_i) . phi(k_m) + N eps),
// eps = 1e-6 in the code convention (its z = 1 / (q . mean k + 1e-6)), 0 in the paper's. No scale.
// Rows do not sum to 1 (the rotation is in the numerator only) and are never renormalised.
#include "../field_support.hpp"

namespace attnscope::reference {

namespace field {

MatD rope_normalised_weights(Convention c, const MatD& fq, const MatD& fk, const Rotation& rotation,
                             std::vector<int>* degenerate) {
  using namespace support;
  const MatD rq = rotate(rotation, fq);
  const MatD rk = rotate(rotation, fk);
  const double n = static_cast<double>(fk.rows());
  MatD w = MatD::Zero(fq.rows(), fk.rows());
  for (Eigen::Index i = 0; i < fq.rows(); ++i) {
    const double S = kept_score_sum(fq, fk, nullptr, i);
    const double denominator = S + n * eps(c);
    if (!std::isfinite(denominator)) {
      poison(w, i);
      continue;
    }
    const bool zero =
        c == Convention::Paper ? tiny(S, magnitude(fq, fk, nullptr, i)) : denominator == 0.0;
    if (zero) {
      if (degenerate) degenerate->push_back(static_cast<int>(i));
      continue;
    }
    for (Eigen::Index j = 0; j < fk.rows(); ++j) w(i, j) = dot(rq, i, rk, j) / denominator;
  }
  return w;
}

MatD rope_normalised_outputs(Convention c, const MatD& fq, const MatD& fk, const MatD& v,
                             const Rotation& rotation) {
  using namespace support;
  const MatD rq = rotate(rotation, fq);
  const MatD rk = rotate(rotation, fk);
  const Eigen::Index n = fk.rows(), d = fk.cols();
  // kv = sum_j R fk_j v_j^T / N and mean fk, as the module forms them before any query.
  MatD kv = MatD::Zero(d, v.cols());
  VecD mean_k = VecD::Zero(d);
  for (Eigen::Index j = 0; j < n; ++j) {
    for (Eigen::Index t = 0; t < d; ++t) {
      mean_k(t) += fk(j, t) / static_cast<double>(n);
      for (Eigen::Index e = 0; e < v.cols(); ++e)
        kv(t, e) += rk(j, t) * v(j, e) / static_cast<double>(n);
    }
  }
  MatD out = MatD::Zero(fq.rows(), v.cols());
  for (Eigen::Index i = 0; i < fq.rows(); ++i) {
    double qk = 0.0, q2 = 0.0, m2 = 0.0;
    for (Eigen::Index t = 0; t < d; ++t) {
      qk += fq(i, t) * mean_k(t);
      q2 += fq(i, t) * fq(i, t);
      m2 += mean_k(t) * mean_k(t);
    }
    const double denominator = qk + eps(c);
    const bool zero = c == Convention::Paper ? support::tiny(qk, std::sqrt(q2) * std::sqrt(m2))
                                             : denominator == 0.0;
    if (zero) continue;
    for (Eigen::Index e = 0; e < v.cols(); ++e) {
      double s = 0.0;
      for (Eigen::Index t = 0; t < d; ++t) s += rq(i, t) * kv(t, e);
      out(i, e) = s / denominator;
    }
  }
  return out;
}

}  // namespace field

MatD mlla_weights(Convention c, const MatD& q, const MatD& k, const Rotation& rotation,
                  std::vector<int>* degenerate) {
  return field::rope_normalised_weights(c, field::elu1(q), field::elu1(k), rotation, degenerate);
}

MatD mlla_outputs(Convention c, const MatD& q, const MatD& k, const MatD& v,
                  const Rotation& rotation) {
  return field::rope_normalised_outputs(c, field::elu1(q), field::elu1(k), v, rotation);
}

MatD weights_mlla(const Variant&, const MatD&, const MatD&, double, const Mask*,
                  std::vector<int>&) {
  field::needs_layer_data("mlla", "the layer's RoPE rotation", "mlla_weights");
}

}  // namespace attnscope::reference
