// Reference rollout: the fusion, the identity, the row normalisation and the products written out
// as plain loops. For tests.
#include "attnscope/analyses/rollout.hpp"

#include "attnscope/error.hpp"
#include "attnscope/family.hpp"

#include <cmath>

namespace attnscope::analyses {

MatD rollout_reference(const std::vector<std::vector<MatD>>& layers, HeadFusion fusion,
                       int* fixed) {
  if (layers.empty()) throw UsageError("rollout: no layer");
  const Eigen::Index n = layers.front().front().rows();
  MatD r = MatD::Identity(n, n);
  for (const std::vector<MatD>& heads : layers) {
    MatD a(n, n);
    for (Eigen::Index i = 0; i < n; ++i) {
      double sum = 0.0, magnitude = 0.0;
      for (Eigen::Index j = 0; j < n; ++j) {
        double x = heads.front()(i, j);
        for (std::size_t h = 1; h < heads.size(); ++h) {
          const double y = heads[h](i, j);
          if (fusion == HeadFusion::Mean) x += y;
          if (fusion == HeadFusion::Max) x = y > x ? y : x;
          if (fusion == HeadFusion::Min) x = y < x ? y : x;
        }
        if (fusion == HeadFusion::Mean) x /= static_cast<double>(heads.size());
        if (i == j) x += 1.0;
        a(i, j) = x;
        sum += x;
        magnitude += std::fabs(x);
      }
      const bool ok = sum > kTinyDenominator * magnitude;
      for (Eigen::Index j = 0; j < n; ++j) a(i, j) = ok ? a(i, j) / sum : (i == j ? 1.0 : 0.0);
      if (!ok && fixed != nullptr) ++*fixed;
    }
    MatD next = MatD::Zero(n, n);
    for (Eigen::Index i = 0; i < n; ++i) {
      for (Eigen::Index j = 0; j < n; ++j) {
        double s = 0.0;
        for (Eigen::Index t = 0; t < n; ++t) s += a(i, t) * r(t, j);
        next(i, j) = s;
      }
    }
    r = next;
  }
  return r;
}

}  // namespace attnscope::analyses
