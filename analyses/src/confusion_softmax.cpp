// Softmax confusion search. Rows are computed in float (one GEMM and one exp per entry); a few
// pivot rows p give the lower bound |d(i,p) - d(j,p)| <= |W_i - W_j| that discards almost every
// pair after a sort. Survivors are decided by the exact judge.
//
// Margin argument. Let W be the exact (double) rows and W~ the float rows. The logit s q_i.k_j
// is computed with absolute error <= |s| |q_i| max|k| (d + 6) u (dot product, scaling, the max
// subtraction; u = 2^-24), which exp turns into a relative error <= expm1(2 delta_i) on each
// entry; the exp itself (a few ulp), the sum (accumulated in double, then rounded to float) and
// the division add less than 16 u relative. So every entry has W~_ij = W_ij (1 + a_ij) with
// |a_ij| <= r_i = (1 + expm1(2 delta_i))(1 + 16 u) - 1, hence |W~_i - W_i|_2 <= r_i |W_i|_2. The
// exact norm is unknown, but |W_i|_2 <= |W~_i|_2 + r_i |W_i|_2 gives
// |W_i|_2 <= |W~_i|_2 / (1 - r_i) when r_i < 1, and |W_i|_2 <= 1 always (probability vector), so
// rho_i = r_i min(1, |W~_i|_2 / (1 - r_i)), the norm of the float row taken in double and
// rounded up by kSlack (relative); entries that underflow in float are off by less than 1e-37
// each, which the absolute kSlack in every comparison covers. Spread-out rows have |W_i|_2 well
// below 1, which shrinks the first-pivot window to little more than eps on real dumps. Pivot
// distances are then accumulated in double from W~, so
// |d~(i,p) - d(i,p)| <= rho_i + rho_p + 1e-12, and a confused pair (|W_i - W_j| <= eps) has
// |d~(i,p) - d~(j,p)| <= eps + rho_i + rho_j + 2 rho_p + 2e-12 for every pivot. We keep a pair
// whenever that holds with the rho terms doubled, then again only if the distance of the float
// rows themselves (accumulated in double) is <= eps + 2 (rho_i + rho_j) + slack: no confused
// pair is ever discarded, and few unconfused ones reach the exact judge.
#include "confusion_search.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cmath>
#include <utility>

namespace attnscope::analyses::detail {

namespace {

constexpr double kFloatUnit = 5.9604644775390625e-8;  // 2^-24
constexpr double kSlack = 1e-9;                       // double rounding of distances, generous
constexpr int kPivots = 4;

// Float-row reductions in double. kLanes independent partial sums (combined at the end) let the
// compiler widen and accumulate whole vectors at a time: one running sum would serialise every
// addition. The order of a double sum of at most a few thousand terms moves it by far less than
// the 1e-12 and kSlack the margin argument allows for.
constexpr int kLanes = 16;
constexpr Eigen::Index kCheckEvery = 64;  // entries between early-exit checks of a row distance

template <typename Term>
double lane_sum(Eigen::Index n, Term term) {
  std::array<double, kLanes> acc{};
  Eigen::Index t = 0;
  for (; t + kLanes <= n; t += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[static_cast<std::size_t>(l)] += term(t + l);
  }
  double s = 0.0;
  for (; t < n; ++t) s += term(t);
  for (const double a : acc) s += a;
  return s;
}

/// Squared distance between two float rows, entries widened to double. With a finite
/// stop_above it sums kCheckEvery entries at a time and returns the partial sum as soon as that
/// exceeds stop_above (partial sums of squares only grow).
double row_distance2(const float* a, const float* b, Eigen::Index n, double stop_above = HUGE_VAL) {
  const Eigen::Index step = stop_above < HUGE_VAL ? kCheckEvery : n;
  double s = 0.0;
  for (Eigen::Index t0 = 0; t0 < n && s <= stop_above; t0 += step) {
    const float *pa = a + t0, *pb = b + t0;
    s += lane_sum(std::min(step, n - t0), [pa, pb](Eigen::Index t) {
      const double diff = static_cast<double>(pa[t]) - static_cast<double>(pb[t]);
      return diff * diff;
    });
  }
  return s;
}

/// Squared Euclidean norm of a float row in double.
double row_norm2(const float* a, Eigen::Index n) {
  return lane_sum(n, [a](Eigen::Index t) {
    const double x = static_cast<double>(a[t]);
    return x * x;
  });
}

/// Sum of a float row in double.
double row_sum(const float* a, Eigen::Index n) {
  return lane_sum(n, [a](Eigen::Index t) { return static_cast<double>(a[t]); });
}

/// Each row's error bound rho_i (see the margin argument), from the float rows w already
/// computed from q and k.
void row_error_bounds(const MatF& q, const MatF& k, double scale, const MatF& w,
                      std::vector<double>& rho) {
  const Eigen::Index n = q.rows(), d = q.cols();
  const double kmax = k.rowwise().norm().maxCoeff();
  rho.resize(static_cast<std::size_t>(n));
  for (Eigen::Index i = 0; i < n; ++i) {
    const double delta = std::abs(scale) * q.row(i).norm() * kmax * static_cast<double>(d + 6) * kFloatUnit;
    // expm1(x) <= x + x^2 for 0 <= x <= 1 (the series' tail is x^2 (e - 2) at most), and far
    // cheaper than expm1 itself.
    const double x = 2.0 * delta;
    const double bound_expm1 = x <= 1.0 ? x + x * x : std::expm1(x);
    const double rel = (1.0 + bound_expm1) * (1.0 + 16.0 * kFloatUnit) - 1.0;
    const double norm_w = std::sqrt(row_norm2(w.row(i).data(), w.cols())) * (1.0 + kSlack);
    rho[static_cast<std::size_t>(i)] = rel < 1.0 ? rel * std::min(1.0, norm_w / (1.0 - rel)) : rel;
  }
}

/// Farthest-first pivots: each new pivot is the row farthest from the pivots chosen so far.
/// Adds pivots to ws.pivots and their columns to ws.dist (distances accumulated in double) until
/// there are `count`; ws.nearest holds each row's distance to its nearest pivot.
void add_pivots(const MatF& w, SoftmaxWorkspace& ws, Eigen::Index count) {
  const Eigen::Index n = w.rows();
  if (ws.pivots.empty()) {
    ws.dist.resize(n, kPivots);
    ws.nearest.setConstant(n, HUGE_VAL);
  }
  while (static_cast<Eigen::Index>(ws.pivots.size()) < std::min(count, n)) {
    const auto c = static_cast<Eigen::Index>(ws.pivots.size());
    Eigen::Index p = 0;
    if (c > 0) ws.nearest.maxCoeff(&p);
    ws.pivots.push_back(p);
    for (Eigen::Index i = 0; i < n; ++i) {
      ws.dist(i, c) = std::sqrt(row_distance2(w.row(i).data(), w.row(p).data(), w.cols()));
      ws.nearest(i) = std::min(ws.nearest(i), ws.dist(i, c));
    }
  }
}

/// Pairs of rows whose first-pivot distances (sorted ascending) lie within `window`.
std::int64_t window_pairs(const std::vector<std::pair<double, Eigen::Index>>& keyed,
                          double window) {
  std::int64_t pairs = 0;
  std::size_t b = 0;
  for (std::size_t a = 0; a < keyed.size(); ++a) {
    b = std::max(b, a + 1);
    while (b < keyed.size() && keyed[b].first - keyed[a].first <= window) ++b;
    pairs += static_cast<std::int64_t>(b - a - 1);
  }
  return pairs;
}

}  // namespace

void softmax_rows_float(const MatF& q, const MatF& k, double scale, MatF& w) {
  w.resize(q.rows(), k.rows());
  w.noalias() = q * k.transpose();
  w *= static_cast<float>(scale);
  for (Eigen::Index i = 0; i < w.rows(); ++i) w.row(i).array() -= w.row(i).maxCoeff();
  // One exp over the whole matrix: the vectorised exp leaves one short tail, not one per row.
  w.array() = w.array().exp();
  for (Eigen::Index i = 0; i < w.rows(); ++i) {
    w.row(i) /= static_cast<float>(row_sum(w.row(i).data(), w.cols()));
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
  softmax_rows_float(q, k, scale, ws.w);
  const MatF& w = ws.w;
  row_error_bounds(q, k, scale, w, rho);
  ws.pivots.clear();
  add_pivots(w, ws, 1);
  const std::vector<Eigen::Index>& pivots = ws.pivots;
  const double rho_max = *std::max_element(rho.begin(), rho.end());
  const double base = judge.eps() * (1.0 + kSlack) + kSlack;

  // Sweep in order of the distance to the first pivot: only pairs within the window of that
  // lower bound are looked at. When that window holds more pairs than a few row distances per
  // row would cost, the other pivots (N row distances each) are computed and their bounds
  // discard most pairs first; either way the float rows' own distance comes last.
  // Rows sorted by that first distance, with their pivot distances and rho copied in the same
  // order so that the sweep reads contiguous memory.
  auto& keyed = ws.keyed;
  keyed.resize(static_cast<std::size_t>(n));
  for (Eigen::Index i = 0; i < n; ++i) keyed[static_cast<std::size_t>(i)] = {ws.dist(i, 0), i};
  std::sort(keyed.begin(), keyed.end());
  const double window = base + 2.0 * (2.0 * rho_max + 2.0 * rho[static_cast<std::size_t>(pivots[0])]);
  if (window_pairs(keyed, window) > (kPivots - 1) * n) add_pivots(w, ws, kPivots);
  const auto np = static_cast<Eigen::Index>(pivots.size());
  MatD& sd = ws.sorted_dist;
  sd.resize(n, np);
  ws.sorted_rho.resize(static_cast<std::size_t>(n));
  for (Eigen::Index a = 0; a < n; ++a) {
    const Eigen::Index i = keyed[static_cast<std::size_t>(a)].second;
    sd.row(a) = ws.dist.row(i).head(np);
    ws.sorted_rho[static_cast<std::size_t>(a)] = rho[static_cast<std::size_t>(i)];
  }
  const std::vector<double>& srho = ws.sorted_rho;
  std::array<double, kPivots> rho_pivot{};  // 2 rho_p of each pivot
  for (std::size_t c = 0; c < pivots.size(); ++c) {
    rho_pivot[c] = 2.0 * rho[static_cast<std::size_t>(pivots[c])];
  }

  for (Eigen::Index a = 0; a < n; ++a) {
    const double rho_a = srho[static_cast<std::size_t>(a)];
    for (Eigen::Index b = a + 1; b < n && sd(b, 0) - sd(a, 0) <= window; ++b) {
      const double rho_ab = rho_a + srho[static_cast<std::size_t>(b)];
      bool keep = true;
      for (Eigen::Index c = 0; c < np && keep; ++c) {
        const double margin = 2.0 * (rho_ab + rho_pivot[static_cast<std::size_t>(c)]);
        keep = std::abs(sd(a, c) - sd(b, c)) <= base + margin;
      }
      if (!keep) continue;
      const Eigen::Index i = keyed[static_cast<std::size_t>(a)].second;
      const Eigen::Index j = keyed[static_cast<std::size_t>(b)].second;
      const double rows_bound2 = std::pow(base + 2.0 * rho_ab, 2);
      if (row_distance2(w.row(i).data(), w.row(j).data(), n, rows_bound2) > rows_bound2) continue;
      ++out.candidates;
      if (judge.confused(static_cast<int>(std::min(i, j)), static_cast<int>(std::max(i, j)))) ++out.pairs;
    }
  }
  return out;
}

}  // namespace attnscope::analyses::detail
