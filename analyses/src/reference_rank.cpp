// Reference rank diagnostics: ExactRows' rows and features, Eigen's JacobiSVD (one-sided Jacobi,
// another algorithm than the fast path's divide and conquer), products and the residual by plain
// loops. For tests.
#include "attnscope/analyses/confusion.hpp"
#include "attnscope/analyses/rank.hpp"

#include <Eigen/SVD>

#include <cmath>
#include <limits>

namespace attnscope::analyses {

namespace {

std::vector<double> jacobi_values(const MatD& m) {
  const Eigen::JacobiSVD<MatD> svd(m);
  const VecD& s = svd.singularValues();
  return {s.data(), s.data() + s.size()};
}

MatD append_ones(const MatD& x) {
  MatD out(x.rows(), x.cols() + 1);
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    for (Eigen::Index j = 0; j < x.cols(); ++j) out(i, j) = x(i, j);
    out(i, x.cols()) = 1.0;
  }
  return out;
}

double residual(const MatF& o) {
  const Eigen::Index n = o.rows(), d = o.cols();
  double total = 0.0, rest = 0.0;
  for (Eigen::Index c = 0; c < d; ++c) {
    double mean = 0.0;
    for (Eigen::Index i = 0; i < n; ++i) mean += o(i, c);
    mean /= static_cast<double>(n);
    for (Eigen::Index i = 0; i < n; ++i) {
      const double x = o(i, c);
      total += x * x;
      rest += (x - mean) * (x - mean);
    }
  }
  return total > 0.0 ? std::sqrt(rest / total) : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

HeadRank head_rank_reference(const Variant& v, const MatF& q, const MatF& k, const MatF& values,
                             const MatF* out, double scale, const RankOptions& opt) {
  const ExactRows rows(v, q, k, scale);
  const int n = rows.tokens();
  MatD w(n, n);
  for (int i = 0; i < n; ++i) rows.row(i, w.row(i).data());
  HeadRank r;
  r.degenerate = rows.degenerate_count();
  r.w = spectrum_of(jacobi_values(w), n, n, opt);
  MatD kd(k.rows(), k.cols());
  for (Eigen::Index i = 0; i < k.rows(); ++i) {
    for (Eigen::Index j = 0; j < k.cols(); ++j) kd(i, j) = k(i, j);
  }
  r.k = spectrum_of(jacobi_values(kd), kd.rows(), kd.cols(), opt);
  r.k1 = spectrum_of(jacobi_values(append_ones(kd)), kd.rows(), kd.cols() + 1, opt);
  const MatD& fk = rows.phi_k();
  if (v.kernel()) {
    r.fk = spectrum_of(jacobi_values(fk), fk.rows(), fk.cols(), opt);
    r.fk1 = spectrum_of(jacobi_values(append_ones(fk)), fk.rows(), fk.cols() + 1, opt);
    MatD state = MatD::Zero(fk.cols(), values.cols());
    for (Eigen::Index a = 0; a < fk.cols(); ++a) {
      for (Eigen::Index b = 0; b < values.cols(); ++b) {
        for (Eigen::Index j = 0; j < fk.rows(); ++j)
          state(a, b) += fk(j, a) * static_cast<double>(values(j, b));
      }
    }
    r.kv = spectrum_of(jacobi_values(state), state.rows(), state.cols(), opt);
    r.has_kv = true;
    r.has_features = true;
  }
  r.out_residual = out != nullptr ? residual(*out) : std::numeric_limits<double>::quiet_NaN();
  return r;
}

}  // namespace attnscope::analyses
