// Reference: InLine eq. 4 over the kept keys, phi(q_i).phi(k_j) - (1/n) sum_kept phi(q_i).phi(k_m)
// + 1/n with n the kept count (N without a mask); degenerate only when no key is kept.
#include "../support.hpp"

namespace attnscope::reference {

MatD weights_inline(const Variant& v, const MatD& q, const MatD& k, double scale, const Mask* mask,
                    std::vector<int>& degenerate) {
  using namespace support;
  const MatD fq = scaled_features(v, q, scale, k.rows());
  const MatD fk = scaled_features(v, k, scale, k.rows());
  MatD w = MatD::Zero(q.rows(), k.rows());
  for (Eigen::Index i = 0; i < q.rows(); ++i) {
    const int n = kept_count(mask, i, k.rows());
    if (n == 0) {
      degenerate.push_back(static_cast<int>(i));
      continue;
    }
    const double S = kept_score_sum(fq, fk, mask, i);
    if (!std::isfinite(S) || !std::isfinite(magnitude(fq, fk, mask, i))) {
      poison(w, i);
      continue;
    }
    const double inv_n = 1.0 / n;
    for (Eigen::Index j = 0; j < k.rows(); ++j) {
      w(i, j) = kept(mask, i, j) ? dot(fq, i, fk, j) - inv_n * S + inv_n : 0.0;
    }
  }
  return w;
}

}  // namespace attnscope::reference
