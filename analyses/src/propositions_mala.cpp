// MALA's eq. 9, 11, 19 and 22 checked by numbers, and where eq. 22's assumption matters.
#include "attnscope/analyses/propositions.hpp"

#include "attnscope/attention.hpp"
#include "propositions_support.hpp"

#include <cmath>
#include <limits>
#include <optional>
#include <sstream>
#include <tuple>
#include <utility>

namespace attnscope::analyses {

using detail::Draws;
using Sense = CheckRow::Sense;

namespace {

/// Rows of MALA weights for phi(q) and for its scaled twin (the identity-map twin of `v` takes
/// the features as they are; the convention's factor is still applied).
MatD mala_rows_at(const CheckInputs& in, const Variant& v, const VecD& phi_q, const VecD& phi_q_a,
                  const MatD& phi_k, double scale) {
  Variant twin = v;
  twin.map = FeatureMap{};
  MatD x(2, phi_q.size());
  x.row(0) = phi_q.transpose();
  x.row(1) = phi_q_a.transpose();
  return detail::weight_rows(in, twin, x, phi_k, scale);
}

VecD scaled(const CheckInputs& in, const VecD& phi_q, double a) {
  return in.scaled_query ? in.scaled_query(phi_q, a) : VecD(a * phi_q);
}

double draw_a(Draws& draws, const CheckInputs& in, double lo, double hi) {
  if (in.a_range) std::tie(lo, hi) = *in.a_range;
  return lo == hi ? lo : draws.uniform(lo, hi);
}

std::string range_text(const CheckInputs& in, const char* fallback) {
  if (!in.a_range) return fallback;
  std::ostringstream s;
  s << "(" << in.a_range->first << ", " << in.a_range->second << "]";
  return s.str();
}

VecD elu1(const VecD& x) {
  static const FeatureMap map = parse_feature_map("elu1");
  return map.apply<double>(MatD(x.transpose())).row(0).transpose();
}

MatD elu1(const MatD& x) {
  static const FeatureMap map = parse_feature_map("elu1");
  return map.apply<double>(x);
}

/// Least-squares fit of a weight row as B s_j - G over its keys; nullopt when the scores s_j do
/// not spread enough to tell B from G.
std::optional<std::pair<double, double>> fit_affine_row(const VecD& w, const VecD& s) {
  const double mean_s = s.mean(), mean_w = w.mean();
  const VecD ds = s.array() - mean_s;
  const double var = ds.squaredNorm();
  if (!(var > 1e-12 * s.squaredNorm())) return std::nullopt;
  const double b = ds.dot(w) / var;
  return std::pair{b, b * mean_s - mean_w};
}

}  // namespace

CheckRow check_mala_rows_sum(std::uint64_t seed, int trials, const CheckInputs& in) {
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row("mala.rows_sum_to_one",
                        "eq. 9, mala:elu1 paper and code, random Q, K: max_i |sum_j w_ij - 1| / "
                        "max(1, sum_j |w_ij|)",
                        kIdentityTolerance, Sense::Below),
      trials, [&](int t) {
        const auto shape = detail::trial_shape(t);
        const Variant v =
            detail::check_variant(in, "mala", t % 2 == 0 ? ":elu1@paper" : ":elu1@code");
        const MatD q = draws.matrix(shape.n, shape.d);
        const MatD k = detail::draw_keys(draws, in, shape.n, shape.d);
        const MatD w = detail::weight_rows(in, v, q, k, detail::default_scale(shape.d));
        const VecD error = (w.rowwise().sum().array() - 1.0).abs();
        const VecD size = w.cwiseAbs().rowwise().sum().cwiseMax(1.0);
        return error.cwiseQuotient(size).maxCoeff();
      });
}

CheckRow check_mala_eq11(std::uint64_t seed, int trials, const CheckInputs& in) {
  const Variant twin = parse_variant("mala:identity@paper");
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row("mala.eq11",
                        "eq. 11: beta, gamma of a phi(q) (from the library's low-rank form) vs "
                        "(beta + a - 1)/a and a gamma, a in " +
                            range_text(in, "(1, 8]") + ": max relative error",
                        kIdentityTolerance, Sense::Below),
      trials, [&](int t) {
        const auto shape = detail::trial_shape(t);
        const VecD phi_q = elu1(draws.vector(shape.d));
        const MatD phi_k = elu1(detail::draw_keys(draws, in, shape.n, shape.d));
        const double a = draw_a(draws, in, 1.0, 8.0);
        MatD x(2, shape.d);
        x.row(0) = phi_q.transpose();
        x.row(1) = scaled(in, phi_q, a).transpose();
        // z_i = [beta_i phi(q_i), -gamma_i] (attention.hpp: a_i f_q(i), b_i): read beta by
        // projecting on phi(q_i).
        const MatD z = low_rank_form<double>(twin, x, phi_k, 1.0).Z;
        const auto beta = [&](int i) {
          return z.row(i).head(shape.d).dot(x.row(i)) / x.row(i).squaredNorm();
        };
        const double gamma0 = -z(0, shape.d), gamma_a = -z(1, shape.d);
        const double beta0 = beta(0), beta_a = beta(1);
        const double e_beta = std::abs(beta_a - (beta0 + a - 1.0) / a) / std::abs(beta_a);
        const double e_gamma = std::abs(gamma_a - a * gamma0) / std::abs(gamma_a);
        return std::max(e_beta, e_gamma);
      });
}

CheckRow check_mala_eq19(std::uint64_t seed, int trials, const CheckInputs& in) {
  const Variant v = detail::check_variant(in, "mala", ":elu1@code");
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row(
          "mala.eq19",
          "eq. 19 on the library's mala:elu1@code rows of phi(q) and a phi(q), a in " +
              range_text(in, "(1.5, 8]") +
              ", each fitted as B s_j - G: x = (G_a/G) / (B_a/B) = a beta/(a + beta - 1): "
              "smallest x - 1",
          0.0, Sense::Above),
      trials, [&](int t) {
        const auto shape = detail::trial_shape(t);
        return detail::first_usable(detail::kMaxRedraws, [&](int) -> std::optional<double> {
          const VecD phi_q = elu1(draws.vector(shape.d));
          const MatD phi_k = elu1(detail::draw_keys(draws, in, shape.n, shape.d));
          const double a = draw_a(draws, in, 1.5, 8.0);
          const MatD w = mala_rows_at(in, v, phi_q, scaled(in, phi_q, a), phi_k,
                                      detail::default_scale(shape.d));
          const VecD s = phi_k * phi_q;
          const auto at_1 = fit_affine_row(w.row(0).transpose(), s);
          const auto at_a = fit_affine_row(w.row(1).transpose(), s);
          if (!at_1 || !at_a) return std::nullopt;  // one key, or keys of equal score: redraw
          return (at_a->second / at_1->second) / (at_a->first / at_1->first) - 1.0;
        });
      });
}

CheckRow check_mala_eq22(std::uint64_t seed, int trials, const CheckInputs& in) {
  const Variant v = detail::check_variant(in, "mala", ":elu1@code");
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row(
          "mala.eq22",
          "eq. 22: p_m > p when every weight is positive at 1 and at a (mala:elu1@code, top vs "
          "bottom key, a in " +
              range_text(in, "(1, 8]") + "): smallest (p_m - p) / p",
          0.0, Sense::Above),
      trials, [&](int t) {
        return detail::first_usable(50, [&](int attempt) -> std::optional<double> {
          const auto shape = detail::trial_shape(t + attempt);
          if (shape.n < 2) return std::nullopt;
          // Small spreads keep every weight positive; larger ones are drawn too and rejected.
          const double sigma = draws.uniform(0.02, 0.5);
          const VecD phi_q = elu1(draws.vector(shape.d, sigma));
          const MatD phi_k = elu1(in.keys ? in.keys(shape.n, shape.d, draws.bits())
                                          : draws.matrix(shape.n, shape.d, sigma));
          const double a = draw_a(draws, in, 1.0, 8.0);
          const MatD w = mala_rows_at(in, v, phi_q, scaled(in, phi_q, a), phi_k,
                                      detail::default_scale(shape.d));
          if (!(w.minCoeff() > 0.0)) return std::nullopt;  // the assumption of eq. 22
          Eigen::Index m = 0, n = 0;
          w.row(0).maxCoeff(&m);
          w.row(0).minCoeff(&n);
          if (w(0, m) == w(0, n)) return std::nullopt;  // no higher-scored key
          const double p = w(0, m) / w(0, n);
          const double pm = w(1, m) / w(1, n);
          return (pm - p) / p;
        });
      });
}

CheckRow check_mala_eq22_counterexample(std::uint64_t seed, int trials, const CheckInputs& in) {
  CheckRow r = detail::start_row(
      "mala.eq22_needs_positivity",
      "eq. 22 without its assumption: a key positive at a = 1 and negative at a = 8 "
      "(mala:elu1@code) gives p_m < p: p - p_m of the first one found",
      0.0, Sense::Above);
  const Variant v = detail::check_variant(in, "mala", ":elu1@code");
  Draws draws(seed);
  for (int t = 0; t < trials; ++t) {
    const auto shape = detail::trial_shape(t);
    const VecD phi_q = elu1(draws.vector(shape.d));
    const MatD phi_k = elu1(detail::draw_keys(draws, in, shape.n, shape.d));
    const double a = draw_a(draws, in, 8.0, 8.0);
    const MatD w =
        mala_rows_at(in, v, phi_q, scaled(in, phi_q, a), phi_k, detail::default_scale(shape.d));
    Eigen::Index m = 0;
    w.row(0).maxCoeff(&m);
    for (Eigen::Index n = 0; n < w.cols(); ++n) {
      if (!(w(0, n) > 0.0 && w(1, n) < 0.0 && w(0, m) > w(0, n))) continue;
      const double p = w(0, m) / w(0, n), pm = w(1, m) / w(1, n);
      std::ostringstream found;
      found << r.what << " (N = " << shape.n << ", d = " << shape.d << ": p = " << p
            << ", p_m = " << pm << ")";
      r.what = found.str();
      r.trials = t;  // the draws searched before this one, then this one
      detail::count_trial(r, p - pm);
      detail::finish(r);
      return r;
    }
  }
  // None found: nothing was shown, which is reported as such (NO DRAW), not as a margin.
  r.trials = r.unusable = trials;
  detail::finish(r);
  return r;
}

}  // namespace attnscope::analyses
