// The low-rank form W = Z M of the kernel families (attention.hpp), from the family's features
// and row form: z_i = [a_i f_q(i), b_i], M = [F_k^T ; 1^T] (no constant column without offset).
#include "attnscope/attention.hpp"

#include "kernel_rows.hpp"

#include <utility>

namespace attnscope {

template <typename T>
LowRankForm low_rank_form(const Variant& v, ConstRef<T> q, ConstRef<T> k, double scale,
                          Diagnostics* diag) {
  const KernelFamily* family = v.kernel();
  if (!family) throw UsageError(v.name() + ": " + std::string(v.family->name()) + " has no low-rank form");
  detail::check_inputs(v, q.rows(), q.cols(), k.rows(), k.cols(), nullptr);
  const KernelFeatures f = kernel_features(v, q.template cast<double>(), k.template cast<double>(), scale);
  const Eigen::Index n = f.k.rows();
  const Eigen::Index r = f.k.cols();
  const bool offset = family->has_offset();
  // S_i from the normaliser features where the family has its own (norm_q, norm_k).
  const VecD key_sum = f.norm_k().colwise().sum().transpose();
  const double key_sum_norm = key_sum.norm();

  LowRankForm out;
  out.Z.setZero(f.q.rows(), offset ? r + 1 : r);
  out.M.resize(offset ? r + 1 : r, n);
  out.M.topRows(r) = f.k.transpose();
  if (offset) out.M.row(r).setOnes();

  std::vector<int> degenerate;
  for (Eigen::Index i = 0; i < f.q.rows(); ++i) {
    const RowForm rf = kernel_row_form(v, f.norm_q().row(i).dot(key_sum.transpose()), static_cast<int>(n),
                                       f.norm_q().row(i).norm() * key_sum_norm);
    if (rf.degenerate) {
      degenerate.push_back(static_cast<int>(i));
      continue;
    }
    out.Z.row(i).head(r) = rf.a * f.q.row(i);
    if (offset) out.Z(i, r) = rf.b;
  }
  if (diag) diag->degenerate_rows = std::move(degenerate);
  return out;
}

template LowRankForm low_rank_form<float>(const Variant&, ConstRef<float>, ConstRef<float>, double,
                                          Diagnostics*);
template LowRankForm low_rank_form<double>(const Variant&, ConstRef<double>, ConstRef<double>,
                                           double, Diagnostics*);

}  // namespace attnscope
