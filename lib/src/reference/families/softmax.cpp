// Reference: softmax, exp(s q_i.k_j) over the kept keys divided by their sum.
#include "../support.hpp"

namespace attnscope::reference {

MatD weights_softmax(const Variant& /*v*/, const MatD& q, const MatD& k, double scale,
                     const Mask* mask, std::vector<int>& degenerate) {
  using namespace support;
  MatD w = MatD::Zero(q.rows(), k.rows());
  for (Eigen::Index i = 0; i < q.rows(); ++i) {
    bool any = false;
    double top = 0.0;
    for (Eigen::Index j = 0; j < k.rows(); ++j) {
      if (!kept(mask, i, j)) continue;
      const double logit = scale * dot(q, i, k, j);
      if (!any || logit > top) top = logit;
      any = true;
    }
    if (!any) {
      degenerate.push_back(static_cast<int>(i));
      continue;
    }
    double total = 0.0;
    for (Eigen::Index j = 0; j < k.rows(); ++j) {
      w(i, j) = kept(mask, i, j) ? std::exp(scale * dot(q, i, k, j) - top) : 0.0;
      total += w(i, j);
    }
    for (Eigen::Index j = 0; j < k.rows(); ++j) w(i, j) /= total;
  }
  return w;
}

}  // namespace attnscope::reference
