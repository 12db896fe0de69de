// MALA's eq. 9, 11, 19 and 22 checked by numbers, and where eq. 22's assumption matters.
#include "attnscope/analyses/propositions.hpp"

#include "attnscope/attention.hpp"
#include "propositions_support.hpp"

#include <cmath>
#include <limits>
#include <sstream>

namespace attnscope::analyses {

using detail::Draws;
using Sense = CheckRow::Sense;

namespace {

/// Rows of MALA weights for phi(q) scaled by 1 and by a (the identity-map twin of `v` takes the
/// features as they are; the convention's factor is still applied).
MatD mala_rows_at(const Variant& v, const VecD& phi_q, double a, const MatD& phi_k, double scale) {
  Variant twin = v;
  twin.map = FeatureMap{};
  MatD x(2, phi_q.size());
  x.row(0) = phi_q.transpose();
  x.row(1) = a * phi_q.transpose();
  return detail::weight_rows(twin, x, phi_k, scale);
}

VecD elu1(const VecD& x) {
  static const FeatureMap map = parse_feature_map("elu1");
  return map.apply<double>(MatD(x.transpose())).row(0).transpose();
}

MatD elu1(const MatD& x) {
  static const FeatureMap map = parse_feature_map("elu1");
  return map.apply<double>(x);
}

}  // namespace

CheckRow check_mala_rows_sum(std::uint64_t seed, int trials) {
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row("mala.rows_sum_to_one",
                        "eq. 9, mala:elu1 paper and code, random Q, K: max_i |sum_j w_ij - 1| / "
                        "max(1, sum_j |w_ij|)",
                        kIdentityTolerance, Sense::Below),
      trials, [&](int t) {
        const auto shape = detail::trial_shape(t);
        const Variant v = parse_variant(t % 2 == 0 ? "mala:elu1@paper" : "mala:elu1@code");
        const MatD q = draws.matrix(shape.n, shape.d), k = draws.matrix(shape.n, shape.d);
        const MatD w = detail::weight_rows(v, q, k, detail::default_scale(shape.d));
        const VecD error = (w.rowwise().sum().array() - 1.0).abs();
        const VecD size = w.cwiseAbs().rowwise().sum().cwiseMax(1.0);
        return error.cwiseQuotient(size).maxCoeff();
      });
}

CheckRow check_mala_eq11(std::uint64_t seed, int trials) {
  const Variant twin = parse_variant("mala:identity@paper");
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row("mala.eq11",
                        "eq. 11: beta, gamma of a phi(q) (from the library's low-rank form) vs "
                        "(beta + a - 1)/a and "
                        "a gamma, a in (1, 8]: max relative error",
                        kIdentityTolerance, Sense::Below),
      trials, [&](int t) {
        const auto shape = detail::trial_shape(t);
        const VecD phi_q = elu1(draws.vector(shape.d));
        const MatD phi_k = elu1(draws.matrix(shape.n, shape.d));
        const double a = draws.uniform(1.0, 8.0);
        MatD x(2, shape.d);
        x.row(0) = phi_q.transpose();
        x.row(1) = a * phi_q.transpose();
        // z_i = [beta_i phi(q_i), gamma_i] (attention.hpp): read beta by projecting on phi(q_i).
        const MatD z = low_rank_form<double>(twin, x, phi_k, 1.0).Z;
        const auto beta = [&](int i) {
          return z.row(i).head(shape.d).dot(x.row(i)) / x.row(i).squaredNorm();
        };
        const double gamma0 = z(0, shape.d), gamma_a = z(1, shape.d);
        const double beta0 = beta(0), beta_a = beta(1);
        const double e_beta = std::abs(beta_a - (beta0 + a - 1.0) / a) / std::abs(beta_a);
        const double e_gamma = std::abs(gamma_a - a * gamma0) / std::abs(gamma_a);
        return std::max(e_beta, e_gamma);
      });
}

CheckRow check_mala_eq19(std::uint64_t seed, int trials) {
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row(
          "mala.eq19",
          "eq. 19: a beta / (a + beta - 1) - 1 for beta in 1 + [1e-6, 1e3], a in 1 + [1e-6, 7]: "
          "smallest excess",
          0.0, Sense::Above),
      trials, [&](int) {
        const double beta = 1.0 + std::pow(10.0, draws.uniform(-6.0, 3.0));
        const double a = 1.0 + std::pow(10.0, draws.uniform(-6.0, std::log10(7.0)));
        return a * beta / (a + beta - 1.0) - 1.0;
      });
}

CheckRow check_mala_eq22(std::uint64_t seed, int trials) {
  CheckRow r = detail::start_row(
      "mala.eq22",
      "eq. 22: p_m > p when every weight is positive at 1 and at a (mala:elu1@code, top vs "
      "bottom key, a in (1, 8]): smallest (p_m - p) / p",
      0.0, Sense::Above);
  const Variant v = parse_variant("mala:elu1@code");
  Draws draws(seed);
  long attempts = 0;
  while (r.trials < trials && attempts < 50L * trials) {
    ++attempts;
    const auto shape = detail::trial_shape(static_cast<int>(attempts));
    if (shape.n < 2) continue;
    // Small spreads keep every weight positive; larger ones are drawn too and rejected.
    const double sigma = draws.uniform(0.02, 0.5);
    const VecD phi_q = elu1(draws.vector(shape.d, sigma));
    const MatD phi_k = elu1(draws.matrix(shape.n, shape.d, sigma));
    const double a = draws.uniform(1.0, 8.0);
    const MatD w = mala_rows_at(v, phi_q, a, phi_k, detail::default_scale(shape.d));
    if (!(w.minCoeff() > 0.0)) continue;
    Eigen::Index m = 0, n = 0;
    w.row(0).maxCoeff(&m);
    w.row(0).minCoeff(&n);
    if (w(0, m) == w(0, n)) continue;  // no higher-scored key
    const double p = w(0, m) / w(0, n);
    const double pm = w(1, m) / w(1, n);
    detail::fold(r, (pm - p) / p);
    ++r.trials;
  }
  if (r.trials == 0) r.margin = 0.0;  // never met the assumption: nothing was shown
  r.decide();
  return r;
}

CheckRow check_mala_eq22_counterexample(std::uint64_t seed, int trials) {
  CheckRow r = detail::start_row(
      "mala.eq22_needs_positivity",
      "eq. 22 without its assumption: a key positive at a = 1 and negative at a = 8 "
      "(mala:elu1@code) gives p_m < p: p - p_m of the first one found",
      0.0, Sense::Above);
  const Variant v = parse_variant("mala:elu1@code");
  constexpr double a = 8.0;
  Draws draws(seed);
  r.margin = 0.0;
  for (int t = 0; t < trials; ++t) {
    ++r.trials;
    const auto shape = detail::trial_shape(t);
    if (shape.n < 2) continue;
    const VecD phi_q = elu1(draws.vector(shape.d));
    const MatD phi_k = elu1(draws.matrix(shape.n, shape.d));
    const MatD w = mala_rows_at(v, phi_q, a, phi_k, detail::default_scale(shape.d));
    Eigen::Index m = 0;
    w.row(0).maxCoeff(&m);
    for (Eigen::Index n = 0; n < w.cols(); ++n) {
      if (!(w(0, n) > 0.0 && w(1, n) < 0.0 && w(0, m) > w(0, n))) continue;
      const double p = w(0, m) / w(0, n), pm = w(1, m) / w(1, n);
      std::ostringstream found;
      found << r.what << " (N = " << shape.n << ", d = " << shape.d << ": p = " << p
            << ", p_m = " << pm << ")";
      r.what = found.str();
      r.margin = p - pm;
      r.decide();
      return r;
    }
  }
  r.decide();
  return r;
}

}  // namespace attnscope::analyses
