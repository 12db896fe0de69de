// Reference: MALA eq. 8-9 over the kept keys, beta phi(q_i).phi(k_j) - gamma with
// S = sum_kept phi(q_i).phi(k_m), beta = 1 + 1/S, gamma = S/n; degenerate where S is zero or tiny.
#include "../support.hpp"

namespace attnscope::reference {

MatD weights_mala(const Variant& v, const MatD& q, const MatD& k, double scale, const Mask* mask,
                  std::vector<int>& degenerate) {
  using namespace support;
  const MatD fq = scaled_features(v, q, scale, k.rows());
  const MatD fk = scaled_features(v, k, scale, k.rows());
  MatD w = MatD::Zero(q.rows(), k.rows());
  for (Eigen::Index i = 0; i < q.rows(); ++i) {
    const int n = kept_count(mask, i, k.rows());
    const double S = kept_score_sum(fq, fk, mask, i);
    const double mag = magnitude(fq, fk, mask, i);
    if (!std::isfinite(S) || !std::isfinite(mag)) {
      poison(w, i);
      continue;
    }
    if (n == 0 || tiny(S, mag)) {
      degenerate.push_back(static_cast<int>(i));
      continue;
    }
    const double beta = 1.0 + 1.0 / S;  // eq. 9
    const double gamma = S / n;
    for (Eigen::Index j = 0; j < k.rows(); ++j) {
      w(i, j) = kept(mask, i, j) ? beta * dot(fq, i, fk, j) - gamma : 0.0;
    }
  }
  return w;
}

}  // namespace attnscope::reference
