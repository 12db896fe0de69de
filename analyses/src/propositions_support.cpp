// Shared pieces of the proposition checks (propositions_support.hpp).
#include "propositions_support.hpp"

#include "attnscope/attention.hpp"
#include "attnscope/portable_math.hpp"

#include <Eigen/QR>
#include <Eigen/SVD>

#include <array>
#include <cmath>
#include <limits>

namespace attnscope::analyses::detail {

double Draws::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double a = 0.0;
  while (!portable::polar_normal_pair(2.0 * unit() - 1.0, 2.0 * unit() - 1.0, a, spare_)) {
  }
  has_spare_ = true;
  return a;
}

MatD Draws::matrix(Eigen::Index rows, Eigen::Index cols, double sigma) {
  MatD m(rows, cols);
  for (Eigen::Index i = 0; i < rows; ++i)
    for (Eigen::Index j = 0; j < cols; ++j) m(i, j) = sigma * normal();
  return m;
}

VecD Draws::vector(Eigen::Index n, double sigma) {
  VecD v(n);
  for (Eigen::Index i = 0; i < n; ++i) v[i] = sigma * normal();
  return v;
}

std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t salt) {
  // splitmix64 of the pair: nearby seeds and salts give unrelated streams.
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (salt + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

Shape trial_shape(int trial, int min_dim) {
  static constexpr std::array<Shape, 5> kShapes{{{2, 1}, {8, 3}, {50, 7}, {197, 16}, {197, 64}}};
  auto i = static_cast<std::size_t>(trial) % kShapes.size();
  while (kShapes[i].d < min_dim && i + 1 < kShapes.size()) ++i;
  return kShapes[i];
}

int numerical_rank(const MatD& m) {
  return static_cast<int>(Eigen::ColPivHouseholderQR<MatD>(m).rank());
}

bool rank_conditions(const MatD& k) {
  MatD k1(k.rows(), k.cols() + 1);
  k1 << k, MatD::Ones(k.rows(), 1);
  return numerical_rank(k) == k.cols() && numerical_rank(k1) == k.cols() + 1;
}

MatD weight_rows(const CheckInputs& in, const Variant& v, const MatD& x, const MatD& k,
                 double scale, bool* degenerate) {
  if (in.weights) {
    if (degenerate != nullptr) *degenerate = false;
    return in.weights(v, x, k, scale);
  }
  Diagnostics diag;
  MatD w = attention_weights<double>(v, x, k, scale, nullptr, &diag);
  if (degenerate != nullptr) *degenerate = !diag.clean();
  return w;
}

VecD weight_row(const CheckInputs& in, const Variant& v, const VecD& x, const MatD& k, double scale,
                bool* degenerate) {
  return weight_rows(in, v, MatD(x.transpose()), k, scale, degenerate).row(0).transpose();
}

Variant check_variant(const CheckInputs& in, const std::string& family, const std::string& rest) {
  const std::string f = in.family.empty() ? family : in.family;
  // The check's map and convention where the family takes a map; the convention alone otherwise.
  if (find_family(f).map_rule() != MapRule::None) return parse_variant(f + rest);
  const auto at = rest.find('@');
  return parse_variant(at == std::string::npos ? f : f + rest.substr(at));
}

MatD draw_keys(Draws& draws, const CheckInputs& in, int n, int d) {
  return in.keys ? in.keys(n, d, draws.bits()) : draws.matrix(n, d);
}

VecD solve_ones(const MatD& k) { return k.colPivHouseholderQr().solve(VecD::Ones(k.rows())); }

MatD hyperplane_keys(Draws& draws, int n, int d, VecD* x0) {
  // |x| in [0.5, 2]: a tiny x would put the keys far out along it, where the rank test's
  // rounding no longer sees the hyperplane.
  VecD x = draws.vector(d);
  x *= draws.uniform(0.5, 2.0) / x.norm();
  MatD k = draws.matrix(n, d);
  // Project each key onto {k : k.x = 1} along x.
  for (Eigen::Index j = 0; j < k.rows(); ++j) {
    k.row(j) -= ((k.row(j).dot(x) - 1.0) / x.squaredNorm()) * x.transpose();
  }
  if (x0 != nullptr) *x0 = x;
  return k;
}

VecD weakest_direction(const MatD& m) {
  Eigen::JacobiSVD<MatD> svd(m, Eigen::ComputeFullV);
  const VecD v = svd.matrixV().col(svd.matrixV().cols() - 1);
  return v.normalized();
}

CheckRow start_row(std::string check, std::string what, double threshold, CheckRow::Sense sense) {
  CheckRow r;
  r.check = std::move(check);
  r.what = std::move(what);
  r.threshold = threshold;
  r.sense = sense;
  r.margin = sense == CheckRow::Sense::Above ? std::numeric_limits<double>::infinity() : 0.0;
  return r;
}

void count_trial(CheckRow& row, const std::optional<double>& value) {
  if (value) {
    fold(row, *value);
  } else {
    ++row.unusable;
  }
  ++row.trials;
}

void finish(CheckRow& row) {
  if (row.trials == row.unusable) row.margin = std::numeric_limits<double>::quiet_NaN();
  row.decide();
}

void fold(CheckRow& row, double value) {
  if (std::isnan(value) || std::isnan(row.margin)) {
    row.margin = std::numeric_limits<double>::quiet_NaN();
    return;
  }
  row.margin = row.sense == CheckRow::Sense::Above ? std::min(row.margin, value)
                                                   : std::max(row.margin, value);
}

}  // namespace attnscope::analyses::detail
