// ExactRows: the double-precision attention rows that define every exact count. Plain loops over
// the family's kernel form, or its score form's exact row (family.hpp); nothing here is
// tuned for speed, everything for predictability, and nothing names a family.
#include "attnscope/analyses/confusion.hpp"

#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"
#include "confusion_search.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

namespace attnscope::analyses {

namespace {

double dot(const double* a, const double* b, Eigen::Index n) {
  double s = 0.0;
  for (Eigen::Index t = 0; t < n; ++t) s += a[t] * b[t];
  return s;
}

}  // namespace

void ExactRows::validate(const Variant& v, Eigen::Ref<const MatF> q, Eigen::Ref<const MatF> k, double scale) {
  if (q.rows() != k.rows() || q.cols() != k.cols()) {
    throw UsageError("confusion: q and k of one head must have the same shape");
  }
  std::string why;
  if (!v.supports(&why)) throw UsageError(v.name() + ": " + why);
  if (!q.allFinite() || !k.allFinite()) {
    throw NumericalError(v.name() + ": a query or key holds a non-finite value");
  }
  if (!v.score()) return;
  // |logit| <= |s| max|q_i| max|k_j|: finite for any float input and a sane scale.
  double q_max = 0.0, k_max = 0.0;
  for (Eigen::Index i = 0; i < q.rows(); ++i) q_max = std::max(q_max, q.row(i).cast<double>().norm());
  for (Eigen::Index j = 0; j < k.rows(); ++j) k_max = std::max(k_max, k.row(j).cast<double>().norm());
  const double logit_bound = std::abs(scale) * q_max * k_max;
  if (!(logit_bound <= kMaxRowMagnitude)) {
    out_of_range(v, "the logits' bound |s| max|q_i| max|k_j|", logit_bound);
  }
}

ExactRows::ExactRows(const Variant& v, Eigen::Ref<const MatF> q, Eigen::Ref<const MatF> k, double scale)
    : variant_(v), n_(static_cast<int>(k.rows())), scale_(scale) {
  validate(v, q, k, scale);
  a_.assign(static_cast<std::size_t>(n_), 0.0);
  b_.assign(static_cast<std::size_t>(n_), 0.0);
  degenerate_.assign(static_cast<std::size_t>(n_), 0);
  if (variant_.score()) {
    q_ = q.cast<double>();
    k_ = k.cast<double>();
    return;
  }
  variant_.map.ensure_params(static_cast<int>(q.cols()));
  KernelFeatures f = kernel_features(variant_, MatD(q.cast<double>()), MatD(k.cast<double>()), scale);
  // S_i from the normaliser features where the family has its own (RoPE in the numerator only).
  const VecD g_k_sum = f.norm_k().colwise().sum().transpose();
  const MatD g_q = f.separate ? std::move(f.gq) : MatD();
  phi_q_ = std::move(f.q);
  phi_k_ = std::move(f.k);
  const MatD& norm_q = g_q.size() > 0 ? g_q : phi_q_;
  const double sum_norm = g_k_sum.norm();
  const double k_norm = phi_k_.norm();
  if (!(k_norm <= kMaxRowMagnitude)) out_of_range("|phi(K)|_F", k_norm);
  for (int i = 0; i < n_; ++i) {
    const double d = dot(norm_q.row(i).data(), g_k_sum.data(), norm_q.cols());
    const double q_norm = phi_q_.row(i).norm();
    // Before the tiny rule: an overflowed product would make every row look degenerate.
    if (!(q_norm * k_norm <= kMaxRowMagnitude)) {
      out_of_range("|phi(q_" + std::to_string(i) + ")| |phi(K)|_F", q_norm * k_norm);
    }
    // The family's row form, with the degenerate rule of attention.hpp's Diagnostics.
    const RowForm rf = kernel_row_form(variant_, d, n_, norm_q.row(i).norm() * sum_norm);
    degenerate_[static_cast<std::size_t>(i)] = rf.degenerate ? 1 : 0;
    if (rf.degenerate) continue;
    a_[static_cast<std::size_t>(i)] = rf.a;
    b_[static_cast<std::size_t>(i)] = rf.b;
    // c_i = a_i, the factor on f_q(i) in the row (confusion_search.hpp's LowRank): every entry of
    // row i, every coordinate of its low-rank form and the search's error bounds are at most
    // (2 |c_i| + 1) |f_q(i)| |F_k|_F + 1 in size (|b_i| <= |a_i| |f_q(i)| |F_k|_F + 1 where rows
    // sum to 1).
    const double ci = rf.a;
    const double bound = (2.0 * std::abs(ci) + 1.0) * q_norm * k_norm + 1.0;
    if (!(std::abs(ci) * q_norm <= kMaxRowMagnitude && bound <= kMaxRowMagnitude)) {
      out_of_range("row " + std::to_string(i) + "'s bound (2|c_i| + 1) |phi(q_i)| |phi(K)|_F + 1", bound);
    }
  }
}

void ExactRows::out_of_range(const std::string& what, double value) const { out_of_range(variant_, what, value); }

void ExactRows::out_of_range(const Variant& v, const std::string& what, double value) {
  std::ostringstream os;
  os << v.name() << ": " << what << " = " << value << " exceeds " << kMaxRowMagnitude
     << ": the attention rows cannot be computed in double without overflow";
  throw NumericalError(os.str());
}

int ExactRows::degenerate_count() const {
  return static_cast<int>(std::count(degenerate_.begin(), degenerate_.end(), char{1}));
}

void ExactRows::row(int i, double* out) const {
  const auto n = static_cast<std::size_t>(n_);
  if (degenerate(i)) {
    std::fill(out, out + n, 0.0);
    return;
  }
  if (const ScoreFamily* scores = variant_.score()) {
    const auto d = static_cast<int>(q_.cols());
    scores->exact_row(q_.row(i).data(), k_.data(), n_, d, scale_, out);
    return;
  }
  const Eigen::Index d = phi_q_.cols();
  const double a = a_[static_cast<std::size_t>(i)], b = b_[static_cast<std::size_t>(i)];
  for (int j = 0; j < n_; ++j) out[j] = a * dot(phi_q_.row(i).data(), phi_k_.row(j).data(), d) + b;
}

VecD ExactRows::row(int i) const {
  VecD r(n_);
  row(i, r.data());
  return r;
}

double squared_distance(const double* a, const double* b, int n) {
  return detail::squared_distance_of(a, b, n);
}

}  // namespace attnscope::analyses
