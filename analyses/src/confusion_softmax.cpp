// Softmax confusion search. Rows are computed in float (one GEMM and one exp per entry); a few
// pivot rows p give the lower bound |d(i,p) - d(j,p)| <= |W_i - W_j| that discards almost every
// pair after a sort. Survivors are decided by the exact judge.
//
// Margin argument. Let W be the exact (double) rows and W~ the float rows. The logit s q_i.k_j
// is computed with absolute error <= |s| |q_i| max|k| (d + 6) u (dot product, scaling, the max
// subtraction; u = 2^-24), which exp turns into a relative error <= expm1(2 delta_i) on each
// entry; the exp itself (a few ulp), the sum (accumulated in double, then rounded to float) and
// the division add less than 16 u relative. As rows are probability vectors (|W_i|_2 <= 1), |W~_i - W_i|_2 <= rho_i
// with rho_i the sum of the two. Pivot distances are then accumulated in double from W~, so
// |d~(i,p) - d(i,p)| <= rho_i + rho_p + 1e-12, and a confused pair (|W_i - W_j| <= eps) has
// |d~(i,p) - d~(j,p)| <= eps + rho_i + rho_j + 2 rho_p + 2e-12 for every pivot. We keep a pair
// whenever that holds with the rho terms doubled, then again only if the distance of the float
// rows themselves (accumulated in double) is <= eps + 2 (rho_i + rho_j) + slack: no confused
// pair is ever discarded, and few unconfused ones reach the exact judge.
#include "confusion_search.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace attnscope::analyses::detail {

namespace {

constexpr double kFloatUnit = 5.9604644775390625e-8;  // 2^-24
constexpr double kSlack = 1e-9;                       // double rounding of distances, generous
constexpr int kPivots = 4;

/// Each row's error bound rho_i (see the margin argument).
void row_error_bounds(const MatF& q, const MatF& k, double scale, std::vector<double>& rho) {
  const Eigen::Index n = q.rows(), d = q.cols();
  const double kmax = k.rowwise().norm().maxCoeff();
  rho.resize(static_cast<std::size_t>(n));
  for (Eigen::Index i = 0; i < n; ++i) {
    const double delta = std::abs(scale) * q.row(i).norm() * kmax * static_cast<double>(d + 6) * kFloatUnit;
    rho[static_cast<std::size_t>(i)] = std::expm1(2.0 * delta) + 16.0 * kFloatUnit;
  }
}

/// Squared distance (in double) between two float rows: each entry widened, differences squared
/// and summed in double by Eigen's vectorised reduction.
double row_distance2(const float* a, const float* b, Eigen::Index n) {
  using Map = Eigen::Map<const Eigen::VectorXf>;
  return (Map(a, n).cast<double>() - Map(b, n).cast<double>()).squaredNorm();
}

/// Farthest-first pivots: each new pivot is the row farthest from the pivots chosen so far.
/// Fills ws.pivots and ws.dist (N x pivots, distances accumulated in double).
void choose_pivots(const MatF& w, SoftmaxWorkspace& ws) {
  const Eigen::Index n = w.rows();
  const auto count = std::min<Eigen::Index>(kPivots, n);
  ws.dist.resize(n, count);
  ws.nearest.setConstant(n, HUGE_VAL);
  ws.pivots.clear();
  Eigen::Index p = 0;
  for (Eigen::Index c = 0; c < count; ++c) {
    ws.pivots.push_back(p);
    for (Eigen::Index i = 0; i < n; ++i) {
      ws.dist(i, c) = std::sqrt(row_distance2(w.row(i).data(), w.row(p).data(), w.cols()));
      ws.nearest(i) = std::min(ws.nearest(i), ws.dist(i, c));
    }
    ws.nearest.maxCoeff(&p);
  }
}

}  // namespace

void softmax_rows_float(const MatF& q, const MatF& k, double scale, MatF& w) {
  w.resize(q.rows(), k.rows());
  w.noalias() = q * k.transpose();
  w *= static_cast<float>(scale);
  for (Eigen::Index i = 0; i < w.rows(); ++i) {
    auto r = w.row(i).array();
    r = (r - r.maxCoeff()).exp();
    r /= static_cast<float>(r.template cast<double>().sum());
  }
}

MatF softmax_rows_float(const MatF& q, const MatF& k, double scale) {
  MatF w;
  softmax_rows_float(q, k, scale, w);
  return w;
}

HeadConfusion search_softmax(const MatF& q, const MatF& k, double scale, PairJudge& judge,
                             SoftmaxWorkspace& ws) {
  HeadConfusion out;
  const Eigen::Index n = q.rows();
  if (n < 2) return out;
  std::vector<double>& rho = ws.rho;
  row_error_bounds(q, k, scale, rho);
  softmax_rows_float(q, k, scale, ws.w);
  const MatF& w = ws.w;
  choose_pivots(w, ws);
  const MatD& dist = ws.dist;
  const std::vector<Eigen::Index>& pivots = ws.pivots;
  const double rho_max = *std::max_element(rho.begin(), rho.end());
  const double base = judge.eps() * (1.0 + kSlack) + kSlack;

  // Sweep in order of the distance to the first pivot: only pairs within the window of that
  // lower bound are looked at, the other pivots' bounds and then the float rows' own distance
  // discard most of those.
  std::vector<Eigen::Index>& order = ws.order;
  order.resize(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), Eigen::Index{0});
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return dist(a, 0) < dist(b, 0); });
  const double window = base + 2.0 * (2.0 * rho_max + 2.0 * rho[static_cast<std::size_t>(pivots[0])]);
  const auto rho_of = [&rho](Eigen::Index i) { return rho[static_cast<std::size_t>(i)]; };

  for (std::size_t a = 0; a < order.size(); ++a) {
    const Eigen::Index i = order[a];
    for (std::size_t b = a + 1; b < order.size() && dist(order[b], 0) - dist(i, 0) <= window; ++b) {
      const Eigen::Index j = order[b];
      bool keep = true;
      for (std::size_t c = 0; c < pivots.size() && keep; ++c) {
        const auto col = static_cast<Eigen::Index>(c);
        const double margin = 2.0 * (rho_of(i) + rho_of(j) + 2.0 * rho_of(pivots[c]));
        keep = std::abs(dist(i, col) - dist(j, col)) <= base + margin;
      }
      if (!keep) continue;
      const double rows_bound = base + 2.0 * (rho_of(i) + rho_of(j));
      if (row_distance2(w.row(i).data(), w.row(j).data(), n) > rows_bound * rows_bound) continue;
      ++out.candidates;
      if (judge.confused(static_cast<int>(std::min(i, j)), static_cast<int>(std::max(i, j)))) ++out.pairs;
    }
  }
  return out;
}

}  // namespace attnscope::analyses::detail
