// Reference: ReLU linear attention (EfficientViT / SANA), w_ij = ReLU(q_i).ReLU(k_j) / D_i over the
// kept keys with D_i = S_i (paper; degenerate where S_i is zero or tiny) or D_i = S_i + 1e-15
// (code, the released LiteMLA's eps; degenerate only where S_i = 0, which ReLU features allow only
// when every product is 0), S_i = sum_kept ReLU(q_i).ReLU(k_m). No scale.
#include "../support.hpp"

namespace attnscope::reference {

MatD weights_relu(const Variant& v, const MatD& q, const MatD& k, double /*scale*/,
                  const Mask* mask, std::vector<int>& degenerate) {
  using namespace support;
  const bool code = v.convention != Convention::Paper;
  MatD rq(q.rows(), q.cols()), rk(k.rows(), k.cols());
  for (Eigen::Index i = 0; i < q.rows(); ++i) {
    for (Eigen::Index t = 0; t < q.cols(); ++t) rq(i, t) = q(i, t) > 0.0 ? q(i, t) : 0.0;
  }
  for (Eigen::Index j = 0; j < k.rows(); ++j) {
    for (Eigen::Index t = 0; t < k.cols(); ++t) rk(j, t) = k(j, t) > 0.0 ? k(j, t) : 0.0;
  }
  MatD w = MatD::Zero(q.rows(), k.rows());
  for (Eigen::Index i = 0; i < q.rows(); ++i) {
    const double S = kept_score_sum(rq, rk, mask, i);
    const double mag = magnitude(rq, rk, mask, i);
    if (!std::isfinite(S) || !std::isfinite(mag)) {
      poison(w, i);
      continue;
    }
    const bool dead = code ? S == 0.0 : tiny(S, mag);
    if (kept_count(mask, i, k.rows()) == 0 || dead) {
      degenerate.push_back(static_cast<int>(i));
      continue;
    }
    const double denominator = code ? S + 1e-15 : S;
    for (Eigen::Index j = 0; j < k.rows(); ++j) {
      w(i, j) = kept(mask, i, j) ? dot(rq, i, rk, j) / denominator : 0.0;
    }
  }
  return w;
}

}  // namespace attnscope::reference
