// Reference: RALA as qhfan/RALA classfication/RALA.py computes it (GateLinearAttentionNoSilu).
// q, k after ELU+1 (phi); each key re-weighted by a softmax over the keys of the mean query,
//   k'_j = N phi(k_j) softmax_j(s mean_i phi(q_i) . phi(k_j)),
// then MLLA's form with k': w_ij = R phi(q_i) . R k'_j / (sum_m phi(q_i) . k'_m + N eps),
// eps = 1e-6 (code) or 0 (paper). The factor N cancels but for eps. Rows do not sum to 1.
#include "../field_support.hpp"

namespace attnscope::reference {
namespace {

/// k'_j = N phi(k_j) softmax_j(s qbar . phi(k_j)), the softmax with its maximum subtracted.
MatD reweighted_keys(const MatD& fq, const MatD& fk, double scale) {
  const Eigen::Index n = fk.rows(), d = fk.cols();
  VecD qbar = VecD::Zero(d);
  for (Eigen::Index i = 0; i < fq.rows(); ++i) {
    for (Eigen::Index t = 0; t < d; ++t) qbar(t) += fq(i, t) / static_cast<double>(fq.rows());
  }
  VecD logit(n);
  double top = -std::numeric_limits<double>::infinity();
  for (Eigen::Index j = 0; j < n; ++j) {
    double s = 0.0;
    for (Eigen::Index t = 0; t < d; ++t) s += qbar(t) * fk(j, t);
    logit(j) = scale * s;
    top = std::max(top, logit(j));
  }
  double total = 0.0;
  for (Eigen::Index j = 0; j < n; ++j) total += std::exp(logit(j) - top);
  MatD out(n, d);
  for (Eigen::Index j = 0; j < n; ++j) {
    const double e = std::exp(logit(j) - top) / total;
    for (Eigen::Index t = 0; t < d; ++t) out(j, t) = fk(j, t) * e * static_cast<double>(n);
  }
  return out;
}

}  // namespace

MatD rala_weights(Convention c, const MatD& q, const MatD& k, double scale,
                  const Rotation& rotation, std::vector<int>* degenerate) {
  const MatD fq = field::elu1(q);
  return field::rope_normalised_weights(c, fq, reweighted_keys(fq, field::elu1(k), scale), rotation,
                                        degenerate);
}

MatD rala_outputs(Convention c, const MatD& q, const MatD& k, const MatD& v, double scale,
                  const Rotation& rotation) {
  const MatD fq = field::elu1(q);
  return field::rope_normalised_outputs(c, fq, reweighted_keys(fq, field::elu1(k), scale), v,
                                        rotation);
}

MatD weights_rala(const Variant&, const MatD&, const MatD&, double, const Mask*,
                  std::vector<int>&) {
  field::needs_layer_data("rala", "the layer's RoPE rotation", "rala_weights");
}

}  // namespace attnscope::reference
