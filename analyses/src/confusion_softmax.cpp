// Softmax confusion search. Rows are computed in float (one GEMM and one exp per entry); a few
// pivot rows p give the lower bound |d(i,p) - d(j,p)| <= |W_i - W_j| that discards almost every
// pair after a sort. Survivors are decided by the exact judge.
//
// Range. The float rows are used only when the logits' error bound below stays under
// kFloatLogitErrorLimit (float_rows_fit). Larger heads (|q|, |k| of 1e19 or 1e30 overflow the
// float logits; far smaller ones already make the margin useless) are searched on the exact
// double rows themselves, with rho = 0: the same sweep, no float anywhere. Every distance the
// sweep sorts is finite: the inputs are checked, and both kinds of rows are probabilities.
//
// Margin argument. Let W be the exact (double) rows and W~ the float rows. The logit s q_i.k_j
// is computed with absolute error <= |s| |q_i| max|k| (d + 6) u + |s| d 2^-149 (dot product,
// scaling, the max subtraction; u = 2^-24; the last term covers products that underflow), which
// exp turns into a relative error <= expm1(2 delta_i) on each
// entry; the exp itself (a few ulp), the sum (accumulated in double, then rounded to float) and
// the multiplication by the sum's rounded reciprocal add less than 16 u relative. So every entry
// has W~_ij = W_ij (1 + a_ij) with |a_ij| <= r_i = (1 + expm1(2 delta_i))(1 + 16 u) - 1, hence |W~_i - W_i|_2 <= r_i |W_i|_2. The
// exact norm is unknown, but |W_i|_2 <= |W~_i|_2 + r_i |W_i|_2 gives
// |W_i|_2 <= |W~_i|_2 / (1 - r_i) when r_i < 1, and |W_i|_2 <= 1 always (probability vector), so
// rho_i = r_i min(1, |W~_i|_2 / (1 - r_i)), with an upper bound of the float row's norm (its
// float sum of squares raised by that sum's error, squared_norm_bounds; the same for |q_i| and
// max |k_j| in the logit bound) rounded up by kSlack (relative); entries that underflow in float are off by less than 1e-37
// each, which the absolute kSlack in every comparison covers. Spread-out rows have |W_i|_2 well
// below 1, which shrinks the first-pivot window to little more than eps on real dumps. Pivot
// distances are then accumulated in double from W~, so
// |d~(i,p) - d(i,p)| <= rho_i + rho_p + 1e-12, and a confused pair (|W_i - W_j| <= eps) has
// |d~(i,p) - d~(j,p)| <= eps + rho_i + rho_j + 2 rho_p + 2e-12 for every pivot. Where eps is
// large enough (pivots_in_float), the pivot distances d^ are summed in float instead, three
// times faster: |d^ - d~| <= kappa d~ (+ an underflow term), so two rows' d^ differ by at most
// their d~'s difference plus float_pivot_slack of that pivot, which every comparison of that
// pivot's distances adds. We keep a pair
// whenever that holds with the rho terms doubled, then again only if the distance of the float
// rows themselves (accumulated in double) is <= eps + 2 (rho_i + rho_j) + slack: no confused
// pair is ever discarded, and few unconfused ones reach the exact judge.
//
// Floating-point model (portable_math.hpp; the build enforces it, portable::probe checks it): IEEE
// binary32/binary64, round to nearest, no contraction of a * b + c except the explicit std::fma of
// portable::gemm_nt (one rounding per step: within the dot-product bound above, which holds for any
// order and for fused steps alike), no reassociation, no x87. exp_float errs by < 1 ulp (the
// "few ulp" above) and flushes results below 2^-126 to 0 (off by < 1.2e-38: within the 1e-37
// allowed above for entries that underflow). The exact judge's rows (softmax_exact_row, or softmax_exact_row_t with its bits: plain loops and portable::exp) are
// the same bits on every CPU, so the counts are too.
#include "confusion_search.hpp"
#include "attnscope/portable_math.hpp"

#include "attnscope/error.hpp"
#include "attnscope/family.hpp"
#include "attnscope/lane_sum.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

namespace attnscope::analyses::detail {

namespace {

constexpr double kFloatUnit = 5.9604644775390625e-8;  // 2^-24
constexpr double kSlack = 1e-9;                       // double rounding of distances, generous
constexpr int kPivots = 4;
static_assert(kPivots <= std::tuple_size_v<decltype(ScoreWorkspace::pivot_slack)>, "a slack per pivot");

// Float-row reductions in double: lane_sum (lane_sum.hpp).
constexpr Eigen::Index kCheckEvery = 64;  // entries between early-exit checks of a row distance

/// Squared distance between two rows, float entries widened to double. With a finite
/// stop_above it sums kCheckEvery entries at a time and returns the partial sum as soon as that
/// exceeds stop_above (partial sums of squares only grow).
template <typename R>
double chunk_distance2(const R* a, const R* b, Eigen::Index n) {
  if constexpr (std::is_same_v<R, float>) {
    return portable::distance2(a, b, n);  // lane_sum's order, in vectors
  } else {
    return lane_sum(n, [a, b](Eigen::Index t) {
      const double diff = static_cast<double>(a[t]) - static_cast<double>(b[t]);
      return diff * diff;
    });
  }
}

template <typename R>
double row_distance2(const R* a, const R* b, Eigen::Index n, double stop_above = HUGE_VAL) {
  const Eigen::Index step = stop_above < HUGE_VAL ? kCheckEvery : n;
  double s = 0.0;
  for (Eigen::Index t0 = 0; t0 < n && s <= stop_above; t0 += step) {
    s += chunk_distance2(a + t0, b + t0, std::min(step, n - t0));
  }
  return s;
}

/// Upper bounds of the squared norms of `rows` float rows of length n (row r at x + r ld): the
/// float sums of squares by fused steps (portable::sums_of_squares_float, within gamma_n relative
/// plus n 2^-149) raised to (sum + n 2^-149) / (1 - gamma_n), rounded up; a row whose float sum is
/// not finite (an entry above about 1.8e19, an Inf or a NaN) takes the double sum instead, NaN and
/// Inf included (the callers test it).
void squared_norm_bounds(const float* x, Eigen::Index ld, Eigen::Index rows, Eigen::Index n, double* out) {
  thread_local std::vector<float> sums;
  sums.resize(static_cast<std::size_t>(rows));
  portable::sums_of_squares_float(x, ld, rows, n, sums.data());
  const double nu = static_cast<double>(n) * kFloatUnit;
  const double gamma = nu < 0.5 ? nu / (1.0 - nu) : HUGE_VAL;
  const double underflow = static_cast<double>(n) * 0x1.0p-149;
  for (Eigen::Index r = 0; r < rows; ++r) {
    const float sum = sums[static_cast<std::size_t>(r)];
    out[r] = std::isfinite(sum) && gamma < 0.5
                 ? (static_cast<double>(sum) + underflow) / (1.0 - gamma) * (1.0 + 0x1.0p-50)
                 : portable::sum_of_squares(x + r * ld, n);
  }
}

}  // namespace

double logit_error(double scale, double q_norm, double k_max, Eigen::Index d) {
  constexpr double kFloatTrueMin = 0x1.0p-149;  // smallest subnormal float
  const auto dd = static_cast<double>(d);
  return std::abs(scale) * (q_norm * k_max * (dd + 6.0) * kFloatUnit + dd * kFloatTrueMin);
}

namespace {

/// Each row's error bound rho_i (see the margin argument), from the float rows w already
/// computed from q and k; q_norm and k_max as float_rows_fit() left them.
void row_error_bounds(const std::vector<double>& q_norm, double k_max, Eigen::Index d,
                      double scale, const MatF& w, std::vector<double>& rho) {
  const Eigen::Index n = w.rows();
  rho.resize(static_cast<std::size_t>(n));
  // Upper bounds of the rows' squared norms, into rho's storage before the bounds.
  std::vector<double>& norm2 = rho;
  squared_norm_bounds(w.data(), w.cols(), n, w.cols(), norm2.data());
  for (Eigen::Index i = 0; i < n; ++i) {
    const double delta = logit_error(scale, q_norm[static_cast<std::size_t>(i)], k_max, d);
    // expm1(x) <= x + x^2 for 0 <= x <= 1 (the series' tail is x^2 (e - 2) at most), and far
    // cheaper than expm1 itself.
    const double x = 2.0 * delta;
    const double bound_expm1 = x <= 1.0 ? x + x * x : std::expm1(x);
    const double rel = (1.0 + bound_expm1) * (1.0 + 16.0 * kFloatUnit) - 1.0;
    const double norm_w = std::sqrt(norm2[static_cast<std::size_t>(i)]) * (1.0 + kSlack);
    rho[static_cast<std::size_t>(i)] = rel < 1.0 ? rel * std::min(1.0, norm_w / (1.0 - rel)) : rel;
  }
}

}  // namespace

// float_pivot_slack (confusion_search.hpp): d^ = sqrt of the float sum, against d = |W~_i - W~_p|_2
// of the same float rows, obeys |d^ - d| <= kappa d + sqrt(n 2^-149), kappa = gamma_(n+2) + 2^-50
// (the float sum within gamma_(n+2) relative, the square root of 1 +- gamma within 1 +- gamma, the
// double sqrt's rounding); d <= d^ / (1 - kappa).
double float_pivot_slack(Eigen::Index n, double farthest) {
  const double nu = static_cast<double>(n + 2) * kFloatUnit;
  const double kappa = nu / (1.0 - nu) + 0x1.0p-50;
  const double underflow = std::sqrt(static_cast<double>(n) * 0x1.0p-149);
  return (2.0 * kappa / (1.0 - kappa) * farthest + 2.0 * underflow) * (1.0 + kSlack);
}

namespace {

/// Whether the pivots' distances are summed in float: when their slack (float_pivot_slack, at
/// most for distances of 2, the largest between two probability rows, plus rounding) stays
/// below a tenth of the comparison's base (about eps), so that it widens the windows by at most
/// a tenth; with a smaller eps, or rows much longer, they are summed in double.
bool pivots_in_float(Eigen::Index n, double base) { return float_pivot_slack(n, 2.1) <= 0.1 * base; }

/// Farthest-first pivots: each new pivot is the row farthest from the pivots chosen so far.
/// Adds pivots to ws.pivots and their columns to ws.dist (distances accumulated in double) until
/// there are `count`; ws.nearest holds each row's distance to its nearest pivot.
template <typename R>
void add_pivots(const Mat<R>& w, ScoreWorkspace& ws, Eigen::Index count) {
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
    // Squared distances to the pivot (dist's rows are strided: through `to_pivot`).
    std::vector<double>& to_pivot = ws.to_pivot;
    to_pivot.resize(static_cast<std::size_t>(n));
    double slack = 0.0;
    if constexpr (std::is_same_v<R, float>) {
      if (ws.float_pivots) {
        std::vector<float>& sums = ws.to_pivot_float;
        sums.resize(static_cast<std::size_t>(n));
        portable::distances2_float(w.data(), w.cols(), n, w.row(p).data(), w.cols(), sums.data());
        std::copy(sums.begin(), sums.end(), to_pivot.begin());
      } else {
        portable::distances2(w.data(), w.cols(), n, w.row(p).data(), w.cols(), to_pivot.data());
      }
    } else {
      for (Eigen::Index i = 0; i < n; ++i) {
        to_pivot[static_cast<std::size_t>(i)] = row_distance2(w.row(i).data(), w.row(p).data(), w.cols());
      }
    }
    double farthest = 0.0;
    for (Eigen::Index i = 0; i < n; ++i) {
      ws.dist(i, c) = std::sqrt(to_pivot[static_cast<std::size_t>(i)]);
      ws.nearest(i) = std::min(ws.nearest(i), ws.dist(i, c));
      farthest = std::max(farthest, ws.dist(i, c));
    }
    if constexpr (std::is_same_v<R, float>) {
      if (ws.float_pivots) slack = float_pivot_slack(w.cols(), farthest);
    }
    ws.pivot_slack[static_cast<std::size_t>(c)] = slack;
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

namespace {

/// The sweep over rows w (Nq x Nk; float rows with their bounds rho, or exact rows with rho = 0).
template <typename R>
HeadConfusion sweep_rows(const Mat<R>& w, const std::vector<double>& rho, PairJudge& judge,
                         ScoreWorkspace& ws) {
  HeadConfusion out;
  const Eigen::Index n = w.rows(), row_length = w.cols();
  const double base = judge.eps() * (1.0 + kSlack) + kSlack;
  ws.float_pivots = std::is_same_v<R, float> && pivots_in_float(row_length, base);
  ws.pivots.clear();
  add_pivots(w, ws, 1);
  const std::vector<Eigen::Index>& pivots = ws.pivots;
  const double rho_max = *std::max_element(rho.begin(), rho.end());

  // Sweep in order of the distance to the first pivot: only pairs within the window of that
  // lower bound are looked at. When that window holds more pairs than a few row distances per
  // row would cost, the other pivots (N row distances each) are computed and their bounds
  // discard most pairs first; either way the float rows' own distance comes last.
  // Rows sorted by that first distance, with their pivot distances and rho copied in the same
  // order so that the sweep reads contiguous memory.
  auto& keyed = ws.keyed;
  keyed.resize(static_cast<std::size_t>(n));
  for (Eigen::Index i = 0; i < n; ++i) {
    // Rows are finite probability vectors, so their distances are finite: a NaN here would make
    // the sort's order undefined, so it stops the search instead.
    if (!std::isfinite(ws.dist(i, 0))) {
      throw NumericalError("softmax confusion: row " + std::to_string(i) +
                           " has a non-finite distance to the first pivot");
    }
    keyed[static_cast<std::size_t>(i)] = {ws.dist(i, 0), i};
  }
  std::sort(keyed.begin(), keyed.end());
  const double window =
      base + 2.0 * (2.0 * rho_max + 2.0 * rho[static_cast<std::size_t>(pivots[0])]) + ws.pivot_slack[0];
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
  std::array<double, kPivots> pivot_base{};  // base plus the float pivot distances' slack
  for (std::size_t c = 0; c < pivots.size(); ++c) {
    rho_pivot[c] = 2.0 * rho[static_cast<std::size_t>(pivots[c])];
    pivot_base[c] = base + ws.pivot_slack[c];
  }

  for (Eigen::Index a = 0; a < n; ++a) {
    const double rho_a = srho[static_cast<std::size_t>(a)];
    for (Eigen::Index b = a + 1; b < n && sd(b, 0) - sd(a, 0) <= window; ++b) {
      const double rho_ab = rho_a + srho[static_cast<std::size_t>(b)];
      bool keep = true;
      for (Eigen::Index c = 0; c < np && keep; ++c) {
        const double margin = 2.0 * (rho_ab + rho_pivot[static_cast<std::size_t>(c)]);
        keep = std::abs(sd(a, c) - sd(b, c)) <= pivot_base[static_cast<std::size_t>(c)] + margin;
      }
      if (!keep) continue;
      const Eigen::Index i = keyed[static_cast<std::size_t>(a)].second;
      const Eigen::Index j = keyed[static_cast<std::size_t>(b)].second;
      // Never counted (the judge would say no): not worth a row distance.
      if (judge.excluded(static_cast<int>(i)) || judge.excluded(static_cast<int>(j))) continue;
      const double rows_bound2 = std::pow(base + 2.0 * rho_ab, 2);
      if (row_distance2(w.row(i).data(), w.row(j).data(), row_length, rows_bound2) > rows_bound2) continue;
      ++out.candidates;
      if (judge.confused(static_cast<int>(std::min(i, j)), static_cast<int>(std::max(i, j)))) ++out.pairs;
    }
  }
  return out;
}

}  // namespace

bool float_rows_fit(Eigen::Ref<const MatF> q, Eigen::Ref<const MatF> k, double scale,
                    std::vector<double>& q_norm, double& k_max) {
  const Eigen::Index d = q.cols();
  q_norm.resize(static_cast<std::size_t>(q.rows()));
  // A float's square is at most 1.2e77: in double these norms are finite unless an entry is not.
  // (Each is tested: std::max would drop a NaN.)
  auto finite = [](double x, const char* what, Eigen::Index row) {
    if (!std::isfinite(x)) {
      throw NumericalError(std::string("softmax: ") + what + " " + std::to_string(row) +
                           " holds a non-finite value");
    }
    return x;
  };
  double q_max = 0.0;
  squared_norm_bounds(q.data(), q.outerStride(), q.rows(), d, q_norm.data());
  for (Eigen::Index i = 0; i < q.rows(); ++i) {
    q_norm[static_cast<std::size_t>(i)] = finite(std::sqrt(q_norm[static_cast<std::size_t>(i)]), "query", i);
    q_max = std::max(q_max, q_norm[static_cast<std::size_t>(i)]);
  }
  k_max = 0.0;
  constexpr Eigen::Index kBlock = 64;  // keys' squared norms a block at a time
  std::array<double, kBlock> k_norm2{};
  for (Eigen::Index j0 = 0; j0 < k.rows(); j0 += kBlock) {
    const Eigen::Index count = std::min(kBlock, k.rows() - j0);
    squared_norm_bounds(k.row(j0).data(), k.outerStride(), count, d, k_norm2.data());
    for (Eigen::Index j = 0; j < count; ++j) {
      k_max = std::max(k_max, finite(k_norm2[static_cast<std::size_t>(j)], "key", j0 + j));
    }
  }
  k_max = std::sqrt(k_max);
  const double s = std::abs(scale);
  const bool normal_scale = s >= static_cast<double>(std::numeric_limits<float>::min()) &&
                            s <= static_cast<double>(std::numeric_limits<float>::max());
  return normal_scale && logit_error(scale, q_max, k_max, d) <= kFloatLogitErrorLimit;
}

HeadConfusion search_scores(const ScoreFamily& family, const MatF& q, const MatF& k, double scale,
                            PairJudge& judge, ScoreWorkspace& ws) {
  if (q.rows() < 2) return {};
  double k_max = 0.0;
  if (float_rows_fit(q, k, scale, ws.q_norm, k_max)) {
    family.rows_float(q, k, scale, ws.w);
    row_error_bounds(ws.q_norm, k_max, q.cols(), scale, ws.w, ws.rho);
    return sweep_rows(ws.w, ws.rho, judge, ws);
  }
  // Outside the float range: the exact rows, which the judge then copies instead of recomputing.
  const int nk = static_cast<int>(k.rows()), d = static_cast<int>(k.cols());
  family.transpose_keys(k, ws.kt);
  ws.wd.resize(q.rows(), k.rows());
  ws.qi.resize(static_cast<std::size_t>(d));
  for (Eigen::Index i = 0; i < q.rows(); ++i) {
    for (int t = 0; t < d; ++t) ws.qi[static_cast<std::size_t>(t)] = static_cast<double>(q(i, t));
    family.exact_row_t(ws.qi.data(), ws.kt.data(), nk, d, scale, ws.wd.row(i).data());
  }
  ws.double_rows = true;
  ws.rho.assign(static_cast<std::size_t>(q.rows()), 0.0);
  return sweep_rows(ws.wd, ws.rho, judge, ws);
}

}  // namespace attnscope::analyses::detail

/// The floating-point model this file's margins assume (portable_math.hpp), checked by the tests.
double attnscope::portable::probe::confusion_softmax(double a, double b, double c) { return a * b + c; }
