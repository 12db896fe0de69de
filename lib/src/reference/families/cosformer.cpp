// Reference: cosFormer (bidirectional), w_ij proportional to ReLU(q_i).ReLU(k_j) cos(pi/2 (i-j)/N)
// over the kept keys, computed with the cosine of the difference itself (not its decomposition);
// degenerate where the row sum is zero or tiny against |ReLU(q_i)| |sum_kept f(k_m)|, f the
// positional features [ReLU(k) cos(pi m/2N), ReLU(k) sin(pi m/2N)].
#include "../support.hpp"

#include <numbers>

namespace attnscope::reference {

MatD weights_cosformer(const Variant& /*v*/, const MatD& q, const MatD& k, double /*scale*/,
                       const Mask* mask, std::vector<int>& degenerate) {
  using namespace support;
  const Eigen::Index n = k.rows(), d = k.cols();
  const double half_pi = std::numbers::pi / 2.0;
  MatD w = MatD::Zero(q.rows(), n);
  for (Eigen::Index i = 0; i < q.rows(); ++i) {
    double S = 0.0, q2 = 0.0, c_sum2 = 0.0, s_sum2 = 0.0;
    for (Eigen::Index t = 0; t < d; ++t) {
      const double rq = std::max(q(i, t), 0.0);
      q2 += rq * rq;
      double cs = 0.0, ss = 0.0;
      for (Eigen::Index m = 0; m < n; ++m) {
        if (!kept(mask, i, m)) continue;
        const double angle = half_pi * static_cast<double>(m) / static_cast<double>(n);
        cs += std::max(k(m, t), 0.0) * std::cos(angle);
        ss += std::max(k(m, t), 0.0) * std::sin(angle);
      }
      c_sum2 += cs * cs;
      s_sum2 += ss * ss;
    }
    for (Eigen::Index j = 0; j < n; ++j) {
      if (!kept(mask, i, j)) continue;
      double relu_dot = 0.0;
      for (Eigen::Index t = 0; t < d; ++t) relu_dot += std::max(q(i, t), 0.0) * std::max(k(j, t), 0.0);
      w(i, j) = relu_dot * std::cos(half_pi * static_cast<double>(i - j) / static_cast<double>(n));
      S += w(i, j);
    }
    if (kept_count(mask, i, n) == 0 || tiny(S, std::sqrt(q2) * std::sqrt(c_sum2 + s_sum2))) {
      for (Eigen::Index j = 0; j < n; ++j) w(i, j) = 0.0;
      degenerate.push_back(static_cast<int>(i));
      continue;
    }
    for (Eigen::Index j = 0; j < n; ++j) w(i, j) /= S;
  }
  return w;
}

}  // namespace attnscope::reference
