// Singular values by fixed-order Householder bidiagonalisation and the Golub-Kahan tridiagonal
// (singular_values.hpp).
#include "attnscope/singular_values.hpp"

#include "attnscope/lane_sum.hpp"

#include <Eigen/Eigenvalues>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

namespace attnscope {

namespace {

using Index = Eigen::Index;

/// The smallest magnitude dqds takes for an entry of B (whose largest entry is at least 1/2).
constexpr double kFloor = 0x1p-500;

/// A Householder reflection H = I - tau v v^T (v_0 = 1) that maps (alpha, x) to (beta, 0), as
/// LAPACK's dlarfg: x is overwritten with v's tail. ss is |x|^2. tau = 0 (H = I) when x is 0.
struct Reflection {
  double beta = 0.0;
  double tau = 0.0;
};

Reflection reflect(double alpha, double ss, double* x, Index stride, Index len) {
  if (ss == 0.0) return {alpha, 0.0};
  const double beta = -std::copysign(std::sqrt(alpha * alpha + ss), alpha);
  const double inv = 1.0 / (alpha - beta);
  for (Index t = 0; t < len; ++t) x[t * stride] *= inv;
  return {beta, (beta - alpha) / beta};
}

/// One dqds transform with shift tau of the qd array (q: n, e: n - 1) into (qq, ee): the Cholesky
/// factor of B^T B - tau I, where B^T B's eigenvalues are those of the array. False when the
/// shifted matrix is not positive definite (tau too large) or a value is not finite. dmin: the
/// smallest pivot, an upper bound on the new array's smallest eigenvalue.
bool dqds_transform(const double* q, const double* e, Index n, double tau, double* qq, double* ee, double& dmin) {
  double d = q[0] - tau;
  dmin = d;
  for (Index k = 0; k + 1 < n; ++k) {
    if (!(d > 0.0)) return false;
    qq[k] = d + e[k];
    const double t = q[k + 1] / qq[k];
    ee[k] = e[k] * t;
    d = d * t - tau;
    dmin = std::min(dmin, d);
  }
  if (!(d >= 0.0) || !(d < HUGE_VAL)) return false;
  qq[n - 1] = d;
  return true;
}

/// The singular values of the upper bidiagonal B (diagonal d, superdiagonal e) by the dqds
/// algorithm (Fernando and Parlett 1994) on its squares: shifted qd transforms, each a positive
/// Cholesky factor, the trailing eigenvalue deflated once its off-diagonal is below (16 eps)^2 of
/// it, relative. False (sigma unusable) when a transform fails at every shift, zero included (an
/// underflow), or it has not converged within its budget of transforms; the caller then takes the
/// tridiagonal QR.
}  // namespace

namespace detail {

bool bidiagonal_values_dqds(const std::vector<double>& d, const std::vector<double>& e, std::vector<double>& sigma) {
  const auto n = static_cast<Index>(d.size());
  std::vector<double> q(static_cast<std::size_t>(n)), qq(static_cast<std::size_t>(n));
  std::vector<double> z(static_cast<std::size_t>(n), 0.0), zz(static_cast<std::size_t>(n), 0.0);
  // Entries below kFloor (B's largest entry is at least 1/2) are raised to it, so that every
  // square is a positive normal number: B moves by at most kFloor per entry, hence each singular
  // value by at most 2 kFloor (Weyl), far below the reduction's own n eps sigma_max.
  const auto square = [](double x) {
    const double a = std::fabs(x) > kFloor ? std::fabs(x) : kFloor;
    return a * a;
  };
  for (Index k = 0; k < n; ++k) {
    q[static_cast<std::size_t>(k)] = square(d[static_cast<std::size_t>(k)]);
    if (k + 1 < n) z[static_cast<std::size_t>(k)] = square(e[static_cast<std::size_t>(k)]);
  }
  constexpr double kTol = 16.0 * std::numeric_limits<double>::epsilon();
  constexpr double kTol2 = kTol * kTol;
  std::vector<double> lambda;
  double shifted = 0.0;  // the sum of the shifts so far
  double next = 0.0;     // the next shift to try
  long budget = 60L * n + 60;
  Index end = n;
  while (end > 1) {
    const auto last = static_cast<std::size_t>(end - 1);
    if (z[last - 1] <= kTol2 * (shifted + q[last])) {
      lambda.push_back(shifted + q[last]);
      --end;
      next = 0.0;
      continue;
    }
    if (--budget < 0) return false;
    double dmin = 0.0;
    bool done = false;
    for (const double factor : {0.99, 0.5, 0.125, 0.0}) {
      const double tau = next * factor;
      if (dqds_transform(q.data(), z.data(), end, tau, qq.data(), zz.data(), dmin)) {
        shifted += tau;
        done = true;
        break;
      }
    }
    if (!done) return false;
    std::copy(qq.begin(), qq.begin() + end, q.begin());
    std::copy(zz.begin(), zz.begin() + (end - 1), z.begin());
    next = dmin;
  }
  lambda.push_back(shifted + q[0]);
  sigma.resize(lambda.size());
  for (std::size_t t = 0; t < lambda.size(); ++t) sigma[t] = std::sqrt(lambda[t]);
  return true;
}

/// The same values as the non-negative eigenvalues of B's Golub-Kahan tridiagonal (2n x 2n, zero
/// diagonal, off-diagonal d0, e0, d1, e1, ..., d_{n-1}) by Eigen's tridiagonal QR: slower, and
/// taken only where dqds declines. NaN where that does not converge either.
void bidiagonal_values_tridiagonal(const std::vector<double>& d, const std::vector<double>& e,
                                   std::vector<double>& sigma) {
  const auto n = static_cast<Index>(d.size());
  VecD diag = VecD::Zero(2 * n), sub(2 * n - 1);
  for (Index t = 0; t < n; ++t) {
    sub(2 * t) = d[static_cast<std::size_t>(t)];
    if (t + 1 < n) sub(2 * t + 1) = e[static_cast<std::size_t>(t)];
  }
  Eigen::SelfAdjointEigenSolver<MatD> solver;
  solver.computeFromTridiagonal(diag, sub, Eigen::EigenvaluesOnly);
  sigma.assign(static_cast<std::size_t>(n), std::numeric_limits<double>::quiet_NaN());
  if (solver.info() != Eigen::Success) return;
  const VecD& lambda = solver.eigenvalues();  // ascending: the n largest are the sigma
  for (Index t = 0; t < n; ++t) sigma[static_cast<std::size_t>(t)] = std::fabs(lambda(2 * n - 1 - t));
}

}  // namespace detail

std::vector<double> singular_values(const MatD& x) {
  const bool transposed = x.rows() < x.cols();
  const Index m = transposed ? x.cols() : x.rows();
  const Index n = transposed ? x.rows() : x.cols();
  if (n == 0) return {};
  double top = 0.0;
  bool finite = true;
  for (Index i = 0; i < x.rows(); ++i)
    for (Index j = 0; j < x.cols(); ++j) {
      const double v = std::fabs(x(i, j));
      finite = finite && v <= std::numeric_limits<double>::max();
      top = v > top ? v : top;
    }
  if (!finite) {  // NaN or infinite entries
    return std::vector<double>(static_cast<std::size_t>(n), std::numeric_limits<double>::quiet_NaN());
  }
  if (top == 0.0) return std::vector<double>(static_cast<std::size_t>(n), 0.0);
  int exponent = 0;
  (void)std::frexp(top, &exponent);  // top = f 2^exponent, f in [1/2, 1)

  // a: m x n, row-major, the largest entry scaled into [1/2, 1) (a power of two: exact).
  std::vector<double> a(static_cast<std::size_t>(m * n));
  // 2^-exponent as a factor where it is a normal double (the same values as ldexp, faster).
  const bool factor_ok = exponent > -1000 && exponent < 1000;
  const double factor = factor_ok ? std::ldexp(1.0, -exponent) : 0.0;
  for (Index i = 0; i < m; ++i)
    for (Index j = 0; j < n; ++j) {
      const double v = transposed ? x(j, i) : x(i, j);
      a[static_cast<std::size_t>(i * n + j)] = factor_ok ? v * factor : std::ldexp(v, -exponent);
    }
  std::vector<double> d(static_cast<std::size_t>(n)), e(static_cast<std::size_t>(n), 0.0);
  std::vector<double> w(static_cast<std::size_t>(n));
  double* const p = a.data();
  // Step k: the left reflection of column k (rows k..m-1) and the right one of row k (columns
  // k+1..n-1), each applied to the rows below. A row's right product depends on that row alone
  // (after its left update), so both updates of a row are made in one pass while it is in cache:
  // the same operations, in the same order, as two passes.
  for (Index k = 0; k < n; ++k) {
    double ss = 0.0;
    for (Index i = k + 1; i < m; ++i) ss += p[i * n + k] * p[i * n + k];
    const Reflection left = reflect(p[k * n + k], ss, p + (k + 1) * n + k, n, m - k - 1);
    d[static_cast<std::size_t>(k)] = left.beta;
    if (k + 1 >= n) break;
    const Index c = k + 1, len = n - c;
    double* wp = w.data();
    const bool apply_left = left.tau != 0.0;
    if (apply_left) {
      // w_j = tau (a_kj + sum_{i>k} v_i a_ij) for the columns j > k, each sum in row order.
      for (Index j = 0; j < len; ++j) wp[j] = p[k * n + c + j];
      for (Index i = k + 1; i < m; ++i) {
        const double vi = p[i * n + k];
        const double* row = p + i * n + c;
        for (Index j = 0; j < len; ++j) wp[j] += vi * row[j];
      }
      for (Index j = 0; j < len; ++j) wp[j] *= left.tau;
      for (Index j = 0; j < len; ++j) p[k * n + c + j] -= wp[j];
    }
    // From the right: row k's columns k+1..n-1; u's tail stored in the row right of e_k.
    double* u = p + k * n + c;
    ss = 0.0;
    for (Index j = 1; j < len; ++j) ss += u[j] * u[j];
    const Reflection right = reflect(u[0], ss, u + 1, 1, len - 1);
    e[static_cast<std::size_t>(k)] = right.beta;
    const bool apply_right = right.tau != 0.0;
    if (!apply_left && !apply_right) continue;
    for (Index i = k + 1; i < m; ++i) {
      double* row = p + i * n + c;
      if (apply_left) {  // a_ij -= v_i w_j
        const double vi = p[i * n + k];
        for (Index j = 0; j < len; ++j) row[j] -= vi * wp[j];
      }
      if (apply_right) {  // z_i = tau (a_i,k+1 + sum_{j>k+1} a_ij u_j) (lane_sum's lanes); a_ij -= z_i u_j
        const double dot = lane_sum(len - 1, [row, u](Index t) { return row[t + 1] * u[t + 1]; });
        const double zi = right.tau * (row[0] + dot);
        row[0] -= zi;
        for (Index j = 1; j < len; ++j) row[j] -= zi * u[j];
      }
    }
  }

  std::vector<double> sigma;
  if (!detail::bidiagonal_values_dqds(d, e, sigma)) detail::bidiagonal_values_tridiagonal(d, e, sigma);
  for (double& s : sigma) s = std::ldexp(s, exponent);
  std::sort(sigma.begin(), sigma.end(), std::greater<>());
  return sigma;
}

}  // namespace attnscope
