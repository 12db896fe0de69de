// The low-rank form W = Z M of the linear families (attention.hpp).
#include "attnscope/attention.hpp"

#include "linear_rows.hpp"

#include <utility>

namespace attnscope {

template <typename T>
LowRankForm low_rank_form(const Variant& v, ConstRef<T> q, ConstRef<T> k, double scale,
                          Diagnostics* diag) {
  if (v.family == Family::Softmax) {
    throw UsageError(v.name() + ": softmax attention has no low-rank form");
  }
  detail::check_inputs(v, q.rows(), q.cols(), k.rows(), k.cols(), nullptr);
  const detail::Features f =
      detail::features(v, q.template cast<double>(), k.template cast<double>(), scale);
  const MatD& pq = f.q;
  const MatD& pk = f.k;
  const Eigen::Index n = pk.rows();
  const Eigen::Index r = pk.cols();
  const VecD key_sum = pk.colwise().sum().transpose();

  LowRankForm out;
  const bool linear = v.family == Family::Linear;
  out.Z.setZero(pq.rows(), linear ? r : r + 1);
  out.M.resize(linear ? r : r + 1, n);
  out.M.topRows(r) = pk.transpose();
  if (v.family == Family::InLine) {
    out.M.topRows(r).colwise() -= key_sum / static_cast<double>(n);
    out.M.row(r).setConstant(1.0 / static_cast<double>(n));
  } else if (v.family == Family::Mala) {
    out.M.row(r).setConstant(-1.0);
  }

  std::vector<int> degenerate;
  for (Eigen::Index i = 0; i < pq.rows(); ++i) {
    const double s = pq.row(i).dot(key_sum.transpose());
    const detail::RowNorm rn =
        detail::row_norm(v.family, s, static_cast<int>(n), pq.row(i).norm() * key_sum.norm());
    if (rn.degenerate) {
      degenerate.push_back(static_cast<int>(i));
    } else if (v.family == Family::InLine) {
      out.Z.row(i) << pq.row(i), 1.0;
    } else {
      out.Z.row(i).head(r) = rn.a * pq.row(i);
      if (!linear) out.Z(i, r) = -rn.b;  // mala: gamma_i
    }
  }
  if (diag) diag->degenerate_rows = std::move(degenerate);
  return out;
}

template LowRankForm low_rank_form<float>(const Variant&, ConstRef<float>, ConstRef<float>, double,
                                          Diagnostics*);
template LowRankForm low_rank_form<double>(const Variant&, ConstRef<double>, ConstRef<double>,
                                           double, Diagnostics*);

}  // namespace attnscope
