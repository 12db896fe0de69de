// Singular values by fixed-order Householder bidiagonalisation and the Golub-Kahan tridiagonal
// (singular_values.hpp).
#include "attnscope/singular_values.hpp"


#include <Eigen/Eigenvalues>

#include <algorithm>
#include <cmath>
#include <cstdlib>
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

/// The reflection of step k from the left: column k's rows k..m-1 mapped to (beta, 0), v's tail
/// stored in the column below the diagonal (|x|^2 summed in row order).
Reflection reflect_column(double* p, Index m, Index n, Index k) {
  double ss = 0.0;
  for (Index i = k + 1; i < m; ++i) ss += p[i * n + k] * p[i * n + k];
  return reflect(p[k * n + k], ss, p + (k + 1) * n + k, n, m - k - 1);
}

/// The left reflection of step k (v in column k below the diagonal, v_k = 1) on row k: w_j = tau
/// (a_kj + sum_{i>k} v_i a_ij) for the columns j > k (w[j - k - 1], each sum in row order), and
/// a_kj -= w_j. The caller applies a_ij -= v_i w_j to the rows below.
void left_products(double* p, Index m, Index n, Index k, double tau, double* w) {
  const Index c = k + 1, len = n - c;
  for (Index j = 0; j < len; ++j) w[j] = p[k * n + c + j];
  for (Index i = k + 1; i < m; ++i) {
    const double vi = p[i * n + k];
    const double* row = p + i * n + c;
    for (Index j = 0; j < len; ++j) w[j] += vi * row[j];
  }
  for (Index j = 0; j < len; ++j) w[j] *= tau;
  for (Index j = 0; j < len; ++j) p[k * n + c + j] -= w[j];
}

/// sum_t x[t] y[t] over 8 fixed lanes (lane t mod 8 for the whole blocks of 8, vectorised), the
/// lanes combined as a tree, then the rest in index order: the same order on every CPU, and a
/// short chain at the end where lane_sum's 16 lanes are added one after another (that chain was a
/// tenth of a row's time in the bidiagonalisation's right products).
double dot_of_rows(const double* x, const double* y, Index n) {
  double l[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
  Index t = 0;
  for (; t + 8 <= n; t += 8) {
    for (int j = 0; j < 8; ++j) l[j] += x[t + j] * y[t + j];
  }
  double tail = 0.0;
  for (; t < n; ++t) tail += x[t] * y[t];
  return (((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]))) + tail;
}

/// The R of the Householder QR of the row-major m x n matrix p (m >= n), each step's reflection
/// as the bidiagonalisation's left one (reflect, left_products, then the rows below); p is
/// overwritten. R is n x n, upper triangular.
MatD householder_r(double* p, Index m, Index n) {
  MatD r = MatD::Zero(n, n);
  std::vector<double> w(static_cast<std::size_t>(n));
  for (Index k = 0; k < n; ++k) {
    const Reflection left = reflect_column(p, m, n, k);
    r(k, k) = left.beta;
    if (k + 1 >= n) break;
    const Index c = k + 1, len = n - c;
    if (left.tau != 0.0) {
      left_products(p, m, n, k, left.tau, w.data());
      for (Index i = k + 1; i < m; ++i) {
        const double vi = p[i * n + k];
        double* row = p + i * n + c;
        for (Index j = 0; j < len; ++j) row[j] -= vi * w[static_cast<std::size_t>(j)];
      }
    }
    for (Index j = c; j < n; ++j) r(k, j) = p[k * n + j];
  }
  return r;
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

namespace {

/// x, transposed when it has more columns than rows (so that m >= n), with a column of ones
/// appended when `ones` (x not transposed then), as a row-major m x n array scaled by 2^-exponent
/// so that x's largest entry is in [1/2, 1) (a power of two: exact; the ones become 2^-exponent).
/// finite: no NaN or infinite entry; zero: every entry of x 0 (a and exponent unset in either
/// case).
struct Scaled {
  std::vector<double> a;
  Index m = 0, n = 0;
  int exponent = 0;
  bool finite = true, zero = false;
};

Scaled scaled_copy(const MatD& x, bool ones) {
  Scaled out;
  const bool transposed = !ones && x.rows() < x.cols();
  out.m = transposed ? x.cols() : x.rows();
  out.n = (transposed ? x.rows() : x.cols()) + (ones ? 1 : 0);
  double top = 0.0;
  for (Index i = 0; i < x.rows(); ++i)
    for (Index j = 0; j < x.cols(); ++j) {
      const double v = std::fabs(x(i, j));
      out.finite = out.finite && v <= std::numeric_limits<double>::max();
      top = v > top ? v : top;
    }
  out.zero = top == 0.0;
  if (!out.finite || out.zero) return out;
  (void)std::frexp(top, &out.exponent);  // top = f 2^exponent, f in [1/2, 1)
  // 2^-exponent as a factor where it is a normal double (the same values as ldexp, faster).
  const int exponent = out.exponent;
  const bool factor_ok = exponent > -1000 && exponent < 1000;
  const double factor = factor_ok ? std::ldexp(1.0, -exponent) : 0.0;
  const auto scale = [&](double v) { return factor_ok ? v * factor : std::ldexp(v, -exponent); };
  const Index m = out.m, n = out.n;
  out.a.resize(static_cast<std::size_t>(m * n));
  const Index from_x = ones ? n - 1 : n;  // the columns that come from x
  for (Index i = 0; i < m; ++i) {
    for (Index j = 0; j < from_x; ++j) {
      out.a[static_cast<std::size_t>(i * n + j)] = scale(transposed ? x(j, i) : x(i, j));
    }
    if (ones) out.a[static_cast<std::size_t>(i * n + n - 1)] = scale(1.0);
  }
  return out;
}

/// Whether the QR first pays for an m x n matrix (m >= n): its R's bidiagonalisation and the QR
/// (2 m n^2 + 2 n^3 operations) against the bidiagonalisation of the whole (4 m n^2 - 4/3 n^3).
bool qr_first(Index m, Index n) { return 3 * m > 5 * n; }

/// The singular values of the scaled array (largest entry in [1/2, 1), m >= n), in no particular
/// order, in its scale: a is overwritten by the bidiagonalisation.
std::vector<double> bidiagonal_values(std::vector<double>& a, Index m, Index n) {
  std::vector<double> d(static_cast<std::size_t>(n)), e(static_cast<std::size_t>(n), 0.0);
  std::vector<double> w(static_cast<std::size_t>(n));
  double* const p = a.data();
  // Step k: the left reflection of column k (rows k..m-1) and the right one of row k (columns
  // k+1..n-1), each applied to the rows below. A row's right product depends on that row alone
  // (after its left update), so both updates of a row are made in one pass while it is in cache:
  // the same operations, in the same order, as two passes.
  for (Index k = 0; k < n; ++k) {
    const Reflection left = reflect_column(p, m, n, k);
    d[static_cast<std::size_t>(k)] = left.beta;
    if (k + 1 >= n) break;
    const Index c = k + 1, len = n - c;
    double* wp = w.data();
    const bool apply_left = left.tau != 0.0;
    if (apply_left) left_products(p, m, n, k, left.tau, wp);
    // From the right: row k's columns k+1..n-1; u's tail stored in the row right of e_k.
    double* u = p + k * n + c;
    double ss = 0.0;
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
      if (apply_right) {  // z_i = tau (a_i,k+1 + sum_{j>k+1} a_ij u_j) (dot_of_rows); a_ij -= z_i u_j
        const double dot = dot_of_rows(row + 1, u + 1, len - 1);
        const double zi = right.tau * (row[0] + dot);
        row[0] -= zi;
        for (Index j = 1; j < len; ++j) row[j] -= zi * u[j];
      }
    }
  }

  std::vector<double> sigma;
  if (!detail::bidiagonal_values_dqds(d, e, sigma)) detail::bidiagonal_values_tridiagonal(d, e, sigma);
  return sigma;
}

/// sigma times 2^exponent, largest first.
std::vector<double> unscaled(std::vector<double> sigma, int exponent) {
  for (double& s : sigma) s = std::ldexp(s, exponent);
  std::sort(sigma.begin(), sigma.end(), std::greater<>());
  return sigma;
}

MatD with_ones(const MatD& x) {
  MatD out(x.rows(), x.cols() + 1);
  out.leftCols(x.cols()) = x;
  out.col(x.cols()).setOnes();
  return out;
}

}  // namespace

std::vector<double> singular_values(const MatD& x) {
  Scaled sc = scaled_copy(x, false);
  const auto n = static_cast<std::size_t>(sc.n);
  if (!sc.finite) return std::vector<double>(n, std::numeric_limits<double>::quiet_NaN());
  if (sc.zero) return std::vector<double>(n, 0.0);
  if (qr_first(sc.m, sc.n)) return unscaled(singular_values(householder_r(sc.a.data(), sc.m, sc.n)), sc.exponent);
  return unscaled(bidiagonal_values(sc.a, sc.m, sc.n), sc.exponent);
}

SingularPair singular_values_with_ones(const MatD& x) {
  const Index n = x.cols() + 1;
  Scaled sc;
  if (x.rows() >= n && qr_first(x.rows(), n)) sc = scaled_copy(x, true);
  // x's scale far from 1 (beyond 2^+-400) would take the ones column's squares out of double's
  // range: then, as for no QR, a NaN or a zero x, each matrix on its own.
  if (sc.a.empty() || std::abs(sc.exponent) > 400) return {singular_values(x), singular_values(with_ones(x))};
  const MatD r = householder_r(sc.a.data(), sc.m, n);
  return {unscaled(singular_values(r.topLeftCorner(n - 1, n - 1)), sc.exponent),
          unscaled(singular_values(r), sc.exponent)};
}

}  // namespace attnscope
