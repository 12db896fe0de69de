// rala (rank-augmented linear attention, RAVLT, Fan et al. CVPR 2025, as qhfan/RALA
// classfication/RALA.py computes it): phi = ELU + 1; the keys re-weighted by a softmax over the
// keys of the mean query,
//   k'_j = N phi(k_j) softmax_j(s qbar.phi(k_j)),  qbar = mean_i phi(q_i)  (the head's queries),
// then MLLA's form with k' and the stage's 2-D RoPE (rope_cos, rope_sin, the same for every head)
// in the numerator only:
//   w_ij = R phi(q_i).R k'_j / (sum_m phi(q_i).k'_m + N eps),  eps = 1e-6 (code) or 0 (paper).
// The kernel form with normaliser features of its own (f = R phi, R k'; g = phi, k'). The keys'
// features depend on every query of the head: weights of a subset of queries computed alone use
// that subset's mean (attention_weights is given the head's queries by every analysis). Rows do
// not sum to 1 and are never renormalised. Under a mask S_i runs over the kept keys and eps over
// their count; k' keeps the model's N keys.
#include "attnscope/family.hpp"

#include "../field_features.hpp"

namespace attnscope {
namespace {

/// k'_j = N phi(k_j) softmax_j(s qbar.phi(k_j)) into out (N x d), qbar the mean of phi(q).
void reweighted_keys(const Variant& v, ConstRef<double> q, ConstRef<double> k, double scale,
                     Eigen::Ref<MatD> out) {
  if (q.rows() < 1) {
    throw UsageError(v.name() +
                     ": the keys' re-weighting needs the head's queries (their mean), none given");
  }
  MatD fq(q.rows(), q.cols());
  detail::elu1_into(q, 1.0, fq);
  const VecD qbar = fq.colwise().mean().transpose();
  detail::elu1_into(k, 1.0, out);
  VecD logit(k.rows());
  for (Eigen::Index j = 0; j < k.rows(); ++j) logit(j) = scale * out.row(j).dot(qbar.transpose());
  const double top = logit.maxCoeff();
  double total = 0.0;
  for (Eigen::Index j = 0; j < k.rows(); ++j) total += (logit(j) = portable::exp(logit(j) - top));
  const auto n = static_cast<double>(k.rows());
  for (Eigen::Index j = 0; j < k.rows(); ++j) out.row(j) *= n * (logit(j) / total);
}

class Rala final : public detail::RopeNumeratorFamily {
 public:
  std::string_view name() const override { return "rala"; }
  std::string_view formula() const override {
    return "R phi(q_i).R k'_j / (sum_m phi(q_i).k'_m [+ N 1e-6 @code]), k'_j = N phi(k_j) "
           "softmax_j(s "
           "mean phi(q).phi(k_j)), phi = ELU+1   (RALA, Fan et al. 2025, RALA.py)";
  }

 protected:
  void base_keys(const Variant& v, ConstRef<double> q, ConstRef<double> k, double scale,
                 Eigen::Ref<MatD> out) const override {
    reweighted_keys(v, q, k, scale, out);
  }
};

}  // namespace

const AttentionFamily& family_rala() {
  static const Rala family;
  return family;
}

}  // namespace attnscope
