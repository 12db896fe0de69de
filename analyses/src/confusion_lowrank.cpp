// Confusion search for the linear families. Every row is W_i = z_i M + 1/N (confusion_search.hpp),
// so |W_i - W_j|^2 = (z_i - z_j)^T G (z_i - z_j) with G = M M^T (d' x d'). With
// G = U diag(lambda) U^T and y_i = z_i U diag(lambda)^1/2 the row distance is the Euclidean
// distance of the y_i: a radius search in d' dimensions that never forms the N x N matrix. We
// sort on the coordinate of the largest eigenvalue and sweep.
//
// Margin argument (u = 2^-53, g = 4 (d' + N + 8) u: a factor 4 over the usual n u bounds of
// sums of n terms, all in double):
// * ExactRows' row i has absolute error at most g a_i with
//   a_i = (2 |c_i| + 1) |phi(q_i)| |phi(K)|_F + 1, c_i the family's row coefficient (1/den_i for
//   normalised kernels, 1 for inline, beta_i for mala; phi here is the family's features): the dot products with the uncentred keys, the rounding of den_i, and the shift it
//   causes in the row's sum (the centred form assumes rows sum to 1).
// * The computed y_i - y_j differs from (z_i - z_j) M by the rounding of z_i, of the mean key and
//   of z U: at most g (|z_i| + |z_j|) (|M|_F + |phi(K)|_F) in norm; forming G and the
//   eigensolver's backward error add at most g |M|_F^2 |z_i - z_j|^2 to the squared distance.
// With delta = g (a_i + a_j + (|z_i| + |z_j|)(|M|_F + |phi(K)|_F)) and E = g |M|_F^2 |dz|^2, if
// the exact distance is <= eps the computed squared distance is <= eps^2 + E + 4 eps delta +
// 4 delta^2, and symmetrically. We use band = 16 (E + 2 eps delta + delta^2) (a factor 4 of
// safety on top): a pair further than band from eps^2 is decided by the low-rank distance, a pair
// inside it by the exact judge.
//
// Floating-point model (portable_math.hpp; the build enforces it, portable::probe checks it): IEEE
// double, round to nearest, no contraction (-ffp-contract=off: every product and sum rounds
// once), no reassociation, no x87. The bounds above hold for any summation order, so they do not
// depend on how the compiler vectorises; the exact judge's own arithmetic (ExactRows, plain loops
// and portable::exp) is the same on every CPU, so the counts are too.
#include "confusion_search.hpp"
#include "attnscope/portable_math.hpp"

#include "attnscope/error.hpp"

#include <Eigen/Eigenvalues>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace attnscope::analyses::detail {

namespace {

constexpr double kDoubleUnit = 1.1102230246251565e-16;  // 2^-53

/// |m_i - m_j|^2 over rows of a row-major matrix: eight running sums in a fixed order, combined
/// pairwise (the same on every CPU; the compiler keeps them in vector registers).
inline double row_distance2(const MatD& m, int i, int j) {
  const double *a = m.row(i).data(), *b = m.row(j).data();
  const Eigen::Index n = m.cols();
  double s[8] = {};
  Eigen::Index t = 0;
  for (; t + 8 <= n; t += 8)
    for (int l = 0; l < 8; ++l) {
      const double d = a[t + l] - b[t + l];
      s[l] += d * d;
    }
  for (; t < n; ++t) {
    const double d = a[t] - b[t];
    s[0] += d * d;
  }
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/// y_i = z_i U diag(lambda)^1/2, columns in ascending eigenvalue order (the last is the widest).
MatD embed(const LowRank& lr) {
  MatD g(lr.m.rows(), lr.m.rows());
  portable::product_nt(lr.m, lr.m, g);
  Eigen::SelfAdjointEigenSolver<MatD> es(g);
  const VecD root = es.eigenvalues().cwiseMax(0.0).cwiseSqrt();
  const MatD basis = es.eigenvectors() * root.asDiagonal();
  MatD y(lr.z.rows(), basis.cols());
  portable::product(lr.z, basis, y);
  return y;
}

}  // namespace

LowRank build_low_rank(const ExactRows& rows) {
  const MatD& pq = rows.phi_q();
  const MatD& pk = rows.phi_k();
  const Eigen::Index r = pq.cols();
  const int n = rows.tokens();
  // Rows that need not sum to 1 keep their own constant: one more column holding e_i.
  const bool unit_rows = rows.variant().rows_sum_to_one();
  LowRank lr;
  lr.z = MatD::Zero(n, unit_rows ? r : r + 1);
  lr.m.resize(lr.z.cols(), n);
  lr.m.topRows(r) = (pk.rowwise() - pk.colwise().mean()).transpose();
  if (!unit_rows) lr.m.row(r).setOnes();
  const VecD key_sum = pk.colwise().sum().transpose();
  for (int i = 0; i < n; ++i) {
    if (rows.degenerate(i)) continue;
    const double a = rows.row_coefficient(i);
    lr.z.row(i).head(r) = a * pq.row(i);
    // Row sum / N: a_i f_q(i).sum f_k / N + b_i, which is 1/N where rows sum to 1.
    if (!unit_rows) {
      lr.z(i, r) = (a * pq.row(i).dot(key_sum.transpose())) / static_cast<double>(n) + rows.row_offset(i);
    }
  }
  lr.offset = unit_rows ? 1.0 / n : 0.0;
  return lr;
}

HeadConfusion search_low_rank(const ExactRows& rows, PairJudge& judge) {
  HeadConfusion out;
  const int n = rows.tokens();
  std::vector<int> live;  // rows that can be in a pair: neither degenerate nor excluded
  for (int i = 0; i < n; ++i) {
    if (!rows.degenerate(i) && !judge.excluded(i)) live.push_back(i);
  }
  if (live.size() < 2) return out;
  const LowRank lr = build_low_rank(rows);
  const MatD y = embed(lr);
  const Eigen::Index last = y.cols() - 1;
  const double g = 4.0 * kDoubleUnit * static_cast<double>(rows.phi_q().cols() + n + 8);
  const double m_norm = lr.m.norm(), k_norm = rows.phi_k().norm();
  const VecD zn = lr.z.rowwise().norm();
  VecD a(n);
  for (int i = 0; i < n; ++i) {
    a(i) = (2.0 * std::abs(rows.row_coefficient(i)) + 1.0) * rows.phi_q().row(i).norm() * k_norm +
           1.0;
  }
  const double eps = judge.eps(), eps2 = judge.eps2();
  auto band = [&](double delta, double dz2) {
    return 16.0 * (g * m_norm * m_norm * dz2 + 2.0 * eps * delta + delta * delta);
  };
  double a_max = 0.0, z_max = 0.0;
  for (int i : live) a_max = std::max(a_max, a(i)), z_max = std::max(z_max, zn(i));
  const double radius =
      std::sqrt(eps2 + band(g * (2.0 * a_max + 2.0 * z_max * (m_norm + k_norm)), 4.0 * z_max * z_max));

  // ExactRows bounds every input of y, so y is finite; a NaN would make the sort's order undefined.
  if (!y.allFinite()) throw NumericalError(rows.variant().name() + ": non-finite low-rank embedding");
  std::sort(live.begin(), live.end(), [&](int p, int q) { return y(p, last) < y(q, last); });
  for (std::size_t s = 0; s < live.size(); ++s) {
    const int i = live[s];
    for (std::size_t t = s + 1; t < live.size() && y(live[t], last) - y(i, last) <= radius; ++t) {
      const int j = live[t];
      const double d2 = row_distance2(y, i, j);
      if (d2 > radius * radius) continue;
      const double delta = g * (a(i) + a(j) + (zn(i) + zn(j)) * (m_norm + k_norm));
      const double bij = band(delta, row_distance2(lr.z, i, j));
      if (d2 > eps2 + bij) continue;
      ++out.candidates;
      const int lo = std::min(i, j), hi = std::max(i, j);
      const bool confused = d2 < eps2 - bij ? judge.eligible(lo, hi) : judge.confused(lo, hi);
      if (confused) ++out.pairs;
    }
  }
  return out;
}

}  // namespace attnscope::analyses::detail

/// The floating-point model this file's margins assume (portable_math.hpp), checked by the tests.
double attnscope::portable::probe::confusion_lowrank(double a, double b, double c) { return a * b + c; }
