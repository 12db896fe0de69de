// ExactRows: the double-precision attention rows that define every exact count. Plain loops over
// the formulas of variant.hpp; nothing here is tuned for speed, everything for predictability.
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

ExactRows::ExactRows(const Variant& v, const MatF& q, const MatF& k, double scale)
    : variant_(v), n_(static_cast<int>(k.rows())), scale_(scale) {
  if (q.rows() != k.rows() || q.cols() != k.cols()) {
    throw UsageError("confusion: q and k of one head must have the same shape");
  }
  std::string why;
  if (!variant_.supports(&why)) throw UsageError(variant_.name() + ": " + why);
  if (!q.allFinite() || !k.allFinite()) {
    throw NumericalError(variant_.name() + ": a query or key holds a non-finite value");
  }
  den_.assign(static_cast<std::size_t>(n_), 0.0);
  degenerate_.assign(static_cast<std::size_t>(n_), 0);
  if (variant_.family == Family::Softmax) {
    q_ = q.cast<double>();
    k_ = k.cast<double>();
    // |logit| <= |s| max|q_i| max|k_j|: finite for any float input and a sane scale.
    const double logit_bound = std::abs(scale) * q_.rowwise().norm().maxCoeff() * k_.rowwise().norm().maxCoeff();
    if (!(logit_bound <= kMaxRowMagnitude)) {
      out_of_range("the logits' bound |s| max|q_i| max|k_j|", logit_bound);
    }
    return;
  }
  variant_.map.ensure_params(static_cast<int>(q.cols()));
  const double c = variant_.phi_factor(scale, n_);
  phi_q_ = variant_.map.apply<double>(MatD(q.cast<double>())) * c;
  phi_k_ = variant_.map.apply<double>(MatD(k.cast<double>())) * c;
  phi_k_sum_ = phi_k_.colwise().sum().transpose();
  const double sum_norm = phi_k_sum_.norm();
  const bool has_denominator = variant_.family == Family::Linear || variant_.family == Family::Mala;
  const double k_norm = phi_k_.norm();
  if (!(k_norm <= kMaxRowMagnitude)) out_of_range("|phi(K)|_F", k_norm);
  for (int i = 0; i < n_; ++i) {
    const double d = dot(phi_q_.row(i).data(), phi_k_sum_.data(), phi_q_.cols());
    den_[static_cast<std::size_t>(i)] = d;
    const double q_norm = phi_q_.row(i).norm();
    // Before the tiny rule: an overflowed product would make every row look degenerate.
    if (!(q_norm * k_norm <= kMaxRowMagnitude)) {
      out_of_range("|phi(q_" + std::to_string(i) + ")| |phi(K)|_F", q_norm * k_norm);
    }
    // The same zero-or-tiny rule as attention.hpp's Diagnostics.
    const bool tiny = std::abs(d) <= kTinyDenominator * q_norm * sum_norm;
    degenerate_[static_cast<std::size_t>(i)] = has_denominator && tiny ? 1 : 0;
    if (degenerate(i)) continue;
    // c_i, the factor on phi(q_i) in the row (confusion_search.hpp's LowRank): every entry of row
    // i, every coordinate of its low-rank form and the search's error bounds are at most
    // (2 |c_i| + 1) |phi(q_i)| |phi(K)|_F + 1 in size.
    const double ci = variant_.family == Family::Linear ? 1.0 / d
                      : variant_.family == Family::Mala ? 1.0 + 1.0 / d
                                                        : 1.0;
    const double bound = (2.0 * std::abs(ci) + 1.0) * q_norm * k_norm + 1.0;
    if (!(std::abs(ci) * q_norm <= kMaxRowMagnitude && bound <= kMaxRowMagnitude)) {
      out_of_range("row " + std::to_string(i) + "'s bound (2|c_i| + 1) |phi(q_i)| |phi(K)|_F + 1", bound);
    }
  }
}

void ExactRows::out_of_range(const std::string& what, double value) const {
  std::ostringstream os;
  os << variant_.name() << ": " << what << " = " << value << " exceeds " << kMaxRowMagnitude
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
  if (variant_.family == Family::Softmax) {
    const auto d = static_cast<int>(q_.cols());
    detail::softmax_exact_row(q_.row(i).data(), k_.data(), n_, d, scale_, out);
    return;
  }
  const Eigen::Index d = phi_q_.cols();
  const double den = den_[static_cast<std::size_t>(i)];
  const double inv_n = 1.0 / n_;
  const double beta = 1.0 + 1.0 / den, gamma = den * inv_n;
  for (int j = 0; j < n_; ++j) {
    const double num = dot(phi_q_.row(i).data(), phi_k_.row(j).data(), d);
    switch (variant_.family) {
      case Family::Linear: out[j] = num / den; break;
      case Family::InLine: out[j] = num - den * inv_n + inv_n; break;
      case Family::Mala: out[j] = beta * num - gamma; break;
      case Family::Softmax: break;
    }
  }
}

VecD ExactRows::row(int i) const {
  VecD r(n_);
  row(i, r.data());
  return r;
}

double squared_distance(const double* a, const double* b, int n) {
  return detail::squared_distance_of(a, b, n);
}

namespace detail {

void softmax_exact_row(const double* qi, const double* k, int n, int d, double scale, double* out) {
  // Four keys at a time: four independent sums, each still accumulated in index order exactly as
  // dot() does, so the logits are dot()'s without waiting on one chain of dependent additions.
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    const double* k0 = k + static_cast<std::ptrdiff_t>(j) * d;
    const double *k1 = k0 + d, *k2 = k1 + d, *k3 = k2 + d;
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    for (int t = 0; t < d; ++t) {
      const double a = qi[t];
      s0 += a * k0[t];
      s1 += a * k1[t];
      s2 += a * k2[t];
      s3 += a * k3[t];
    }
    out[j] = scale * s0;
    out[j + 1] = scale * s1;
    out[j + 2] = scale * s2;
    out[j + 3] = scale * s3;
  }
  for (; j < n; ++j) out[j] = scale * dot(qi, k + static_cast<std::ptrdiff_t>(j) * d, d);
  double max_logit = -HUGE_VAL;
  for (int t = 0; t < n; ++t) max_logit = std::max(max_logit, out[t]);
  double sum = 0.0;
  for (int t = 0; t < n; ++t) sum += (out[t] = std::exp(out[t] - max_logit));
  for (int t = 0; t < n; ++t) out[t] /= sum;
}

}  // namespace detail

}  // namespace attnscope::analyses
