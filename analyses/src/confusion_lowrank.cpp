// Confusion search for the linear families. Every row is W_i = z_i M (attention.hpp's low-rank
// form, built here from ExactRows' features), so |W_i - W_j|^2 = (z_i - z_j)^T G (z_i - z_j) with
// G = M M^T (r x r, r = d' or d' + 1). With G = U diag(lambda) U^T and y_i = z_i U diag(lambda)^1/2
// the row distance is the Euclidean distance of the y_i: a radius search in r dimensions that
// never forms the N x N matrix. We sort on the coordinate of the largest eigenvalue and sweep.
//
// Margin argument. In double (u = 2^-53) the computed |y_i - y_j|^2 differs from the exact-row
// distance by forming G (N u |M|_F^2 |dz|^2), the eigensolver's backward error (r u |G|), the
// products z U (r u |L| |z|) and the rounding of the exact rows themselves (d u times the
// uncentred magnitudes |phi(q)| |phi(K)|_F, which |z| (|M|_F + |phi(K)|_F + 1) bounds). With
// B = (|z_i| + |z_j|) (|M|_F + |phi(K)|_F + 1) all of these are below
//   band = 64 u (N + r + d + 8) B^2 (1 + sqrt(N) B),
// the factor 64 being a safety margin. A pair whose low-rank distance is more than band away
// from eps^2 is decided by it; the few inside the band are decided by the exact judge.
// GCC 12 reports a false -Wmaybe-uninitialized inside Eigen's AVX-512 kernels.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "confusion_search.hpp"

#include <Eigen/Eigenvalues>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace attnscope::analyses::detail {

namespace {

constexpr double kDoubleUnit = 1.1102230246251565e-16;  // 2^-53

}  // namespace

LowRank build_low_rank(const ExactRows& rows) {
  const MatD& pq = rows.phi_q();
  const MatD& pk = rows.phi_k();
  const Eigen::Index n = pq.rows(), d = pq.cols();
  const double inv_n = 1.0 / static_cast<double>(n);
  LowRank lr;
  switch (rows.variant().family) {
    case Family::Linear:
      lr.z = pq;
      for (Eigen::Index i = 0; i < n; ++i) {
        const int row = static_cast<int>(i);
        if (rows.degenerate(row)) {
          lr.z.row(i).setZero();
        } else {
          lr.z.row(i) /= rows.denominator(row);
        }
      }
      lr.m = pk.transpose();
      break;
    case Family::InLine:
      lr.z.resize(n, d + 1);
      lr.z << pq, VecD::Ones(n);
      lr.m.resize(d + 1, n);
      lr.m << (pk.rowwise() - pk.colwise().mean()).transpose(), Eigen::RowVectorXd::Constant(n, inv_n);
      break;
    case Family::Mala:
      lr.z.resize(n, d + 1);
      for (Eigen::Index i = 0; i < n; ++i) {
        const double den = rows.denominator(static_cast<int>(i));
        const double beta = rows.degenerate(static_cast<int>(i)) ? 0.0 : 1.0 + 1.0 / den;
        lr.z.row(i) << beta * pq.row(i), den * inv_n;
      }
      lr.m.resize(d + 1, n);
      lr.m << pk.transpose(), Eigen::RowVectorXd::Constant(n, -1.0);
      break;
    case Family::Softmax: break;
  }
  return lr;
}

namespace {

/// y_i = z_i U diag(lambda)^1/2, columns in ascending eigenvalue order (the last is the widest).
MatD embed(const LowRank& lr) {
  const MatD g = lr.m * lr.m.transpose();
  Eigen::SelfAdjointEigenSolver<MatD> es(g);
  const VecD root = es.eigenvalues().cwiseMax(0.0).cwiseSqrt();
  return lr.z * (es.eigenvectors() * root.asDiagonal());
}

}  // namespace

HeadConfusion search_low_rank(const ExactRows& rows, PairJudge& judge) {
  HeadConfusion out;
  const int n = rows.tokens();
  std::vector<int> live;
  for (int i = 0; i < n; ++i) {
    if (!rows.degenerate(i)) live.push_back(i);
  }
  if (live.size() < 2) return out;
  const LowRank lr = build_low_rank(rows);
  const MatD y = embed(lr);
  const Eigen::Index r = y.cols(), last = r - 1;
  const double f = lr.m.norm() + rows.phi_k().norm() + 1.0;
  const VecD zn = lr.z.rowwise().norm();
  const double cu = 64.0 * kDoubleUnit * static_cast<double>(n + r + rows.phi_q().cols() + 8);
  auto band = [&](double b) { return cu * b * b * (1.0 + std::sqrt(static_cast<double>(n)) * b); };
  double zmax = 0.0;
  for (int i : live) zmax = std::max(zmax, zn(i));
  const double eps2 = judge.eps2();
  const double radius = std::sqrt(eps2 + band(2.0 * zmax * f));

  std::sort(live.begin(), live.end(), [&](int a, int b) { return y(a, last) < y(b, last); });
  for (std::size_t a = 0; a < live.size(); ++a) {
    const int i = live[a];
    for (std::size_t b = a + 1; b < live.size() && y(live[b], last) - y(i, last) <= radius; ++b) {
      const int j = live[b];
      const double d2 = (y.row(i) - y.row(j)).squaredNorm();
      const double bij = band((zn(i) + zn(j)) * f);
      if (d2 > eps2 + bij) continue;
      ++out.candidates;
      const int lo = std::min(i, j), hi = std::max(i, j);
      const bool confused = d2 < eps2 - bij ? judge.queries_differ(lo, hi) : judge.confused(lo, hi);
      if (confused) ++out.pairs;
    }
  }
  return out;
}

}  // namespace attnscope::analyses::detail
