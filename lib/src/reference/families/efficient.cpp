// Reference: Efficient Attention, w_ij = rho_q(q_i).rho_k(k_j) with rho_q a softmax over each
// query's features and rho_k a softmax over the tokens of each key feature (no scale); under a mask
// the kept entries are divided by their sum, degenerate where that sum is zero or tiny.
#include "../support.hpp"

namespace attnscope::reference {

MatD weights_efficient(const Variant& /*v*/, const MatD& q, const MatD& k, double /*scale*/,
                       const Mask* mask, std::vector<int>& degenerate) {
  using namespace support;
  MatD rq(q.rows(), q.cols()), rk(k.rows(), k.cols());
  for (Eigen::Index i = 0; i < q.rows(); ++i) {  // softmax over the features of query i
    double top = q(i, 0), total = 0.0;
    for (Eigen::Index t = 0; t < q.cols(); ++t) top = std::max(top, q(i, t));
    for (Eigen::Index t = 0; t < q.cols(); ++t) total += (rq(i, t) = std::exp(q(i, t) - top));
    for (Eigen::Index t = 0; t < q.cols(); ++t) rq(i, t) /= total;
  }
  for (Eigen::Index t = 0; t < k.cols(); ++t) {  // softmax over the tokens of key feature t
    double top = k(0, t), total = 0.0;
    for (Eigen::Index j = 0; j < k.rows(); ++j) top = std::max(top, k(j, t));
    for (Eigen::Index j = 0; j < k.rows(); ++j) total += (rk(j, t) = std::exp(k(j, t) - top));
    for (Eigen::Index j = 0; j < k.rows(); ++j) rk(j, t) /= total;
  }
  MatD w = MatD::Zero(q.rows(), k.rows());
  for (Eigen::Index i = 0; i < q.rows(); ++i) {
    double S = 0.0;
    for (Eigen::Index j = 0; j < k.rows(); ++j) {
      if (!kept(mask, i, j)) continue;
      w(i, j) = dot(rq, i, rk, j);
      S += w(i, j);
    }
    if (kept_count(mask, i, k.rows()) == 0 || tiny(S, magnitude(rq, rk, mask, i))) {
      for (Eigen::Index j = 0; j < k.rows(); ++j) w(i, j) = 0.0;
      degenerate.push_back(static_cast<int>(i));
      continue;
    }
    for (Eigen::Index j = 0; j < k.rows(); ++j) w(i, j) /= S;
  }
  return w;
}

}  // namespace attnscope::reference
