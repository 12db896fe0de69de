// Local attention mass per grid query. A score family (softmax) sums its float rows (one GEMM,
// one exp per entry), or its exact double rows for a head outside the float range
// (confusion_search.hpp's float_rows_fit: large |q| |k| would overflow the float logits); the
// linear families never form the N x N matrix: the mass of query i is z_i . (sum of M's columns
// over i's window) + |window| / N, from the centred low-rank form W = z M + 1/N (rows that need not
// sum to 1 carry their own constant in z and M instead: confusion_search.hpp).
#include "attnscope/analyses/locality.hpp"

#include "attnscope/analyses/confusion.hpp"
#include "attnscope/error.hpp"
#include "attnscope/family.hpp"
#include "confusion_search.hpp"

#include <cmath>
#include <limits>

namespace attnscope::analyses {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

void check_window(const TokenGrid& grid, int window, Eigen::Index tokens) {
  if (window < 1 || window % 2 == 0) {
    throw UsageError("--window must be a positive odd number, found " + std::to_string(window));
  }
  if (grid.tokens() != tokens) {
    throw UsageError("locality: the grid has " + std::to_string(grid.tokens()) + " tokens but the head has " +
                     std::to_string(tokens));
  }
}

/// sum of entry(j) over the window of token i, in window()'s order.
template <typename Entry>
double window_sum(const TokenGrid& grid, int i, int window, Entry entry) {
  double s = 0.0;
  grid.for_each_in_window(i, window, [&](int j) { s += entry(j); });
  return s;
}

std::vector<double> score_mass(const ScoreFamily& family, Eigen::Ref<const MatF> q,
                               Eigen::Ref<const MatF> k, double scale, const TokenGrid& grid,
                               int window) {
  std::vector<double> mass(static_cast<std::size_t>(grid.tokens()), kNaN);
  std::vector<double> q_norm;
  double k_max = 0.0;
  if (detail::float_rows_fit(q, k, scale, q_norm, k_max)) {
    // Reused from head to head; rows_float's weights formed only inside the windows.
    thread_local MatF e;
    thread_local std::vector<float> factor;
    family.rows_float_factored(q, k, scale, e, factor);
    for (int i = grid.prefix; i < grid.tokens(); ++i) {
      const float f = factor[static_cast<std::size_t>(i)];
      mass[static_cast<std::size_t>(i)] = window_sum(grid, i, window, [&](int j) { return static_cast<double>(e(i, j) * f); });
    }
    return mass;
  }
  const MatD kd = k.cast<double>();
  VecD qi(q.cols()), w(k.rows());
  for (int i = grid.prefix; i < grid.tokens(); ++i) {
    qi = q.row(i).cast<double>().transpose();
    family.exact_row(qi.data(), kd.data(), static_cast<int>(k.rows()), static_cast<int>(k.cols()),
                     scale, w.data());
    mass[static_cast<std::size_t>(i)] = window_sum(grid, i, window, [&](int j) { return w(j); });
  }
  return mass;
}

std::vector<double> low_rank_mass(const ExactRows& rows, const TokenGrid& grid, int window) {
  const detail::LowRank lr = detail::build_low_rank(rows);
  std::vector<double> mass(static_cast<std::size_t>(grid.tokens()), kNaN);
  VecD cols(lr.m.rows());
  for (int i = grid.prefix; i < grid.tokens(); ++i) {
    if (rows.degenerate(i)) continue;
    cols.setZero();
    const int cells = grid.for_each_in_window(i, window, [&](int j) { cols += lr.m.col(j); });
    mass[static_cast<std::size_t>(i)] = lr.z.row(i).dot(cols) + lr.offset * static_cast<double>(cells);
  }
  return mass;
}

int degenerate_grid_rows(const ExactRows& rows, const TokenGrid& grid) {
  int c = 0;
  for (int i = grid.prefix; i < grid.tokens(); ++i) c += rows.degenerate(i) ? 1 : 0;
  return c;
}

}  // namespace

void RunningStats::add(double x) {
  ++count;
  const double delta = x - mean;
  mean += delta / static_cast<double>(count);
  m2 += delta * (x - mean);
  min = std::min(min, x);
  max = std::max(max, x);
}

void RunningStats::merge(const RunningStats& o) {
  if (o.count == 0) return;
  if (count == 0) {
    *this = o;
    return;
  }
  const double n = static_cast<double>(count + o.count);
  const double delta = o.mean - mean;
  mean += delta * static_cast<double>(o.count) / n;
  m2 += o.m2 + delta * delta * static_cast<double>(count) * static_cast<double>(o.count) / n;
  count += o.count;
  min = std::min(min, o.min);
  max = std::max(max, o.max);
}

double RunningStats::stddev() const {
  return count < 2 ? 0.0 : std::sqrt(m2 / static_cast<double>(count));
}

std::vector<double> local_mass(const Variant& v, Eigen::Ref<const MatF> q, Eigen::Ref<const MatF> k,
                               double scale, const TokenGrid& grid, int window, int* degenerate) {
  check_window(grid, window, k.rows());
  if (const ScoreFamily* scores = v.score()) {
    std::string why;
    if (!v.supports(&why)) throw UsageError(v.name() + ": " + why);
    if (degenerate) *degenerate = 0;
    return score_mass(*scores, q, k, scale, grid, window);
  }
  const ExactRows rows(v, q, k, scale);
  if (degenerate) *degenerate = degenerate_grid_rows(rows, grid);
  return low_rank_mass(rows, grid, window);
}

double uniform_baseline(const TokenGrid& grid, int window) {
  const int cells = grid.height * grid.width;
  if (cells == 0) return 0.0;
  double s = 0.0;
  for (int i = grid.prefix; i < grid.tokens(); ++i) s += grid.window_size(i, window);
  return s / cells / grid.tokens();
}

}  // namespace attnscope::analyses
