// InLine's Propositions 1-3 and Lemma 1, checked by numbers (propositions.hpp).
#include "attnscope/analyses/propositions.hpp"

#include "propositions_support.hpp"

#include <Eigen/LU>
#include <Eigen/QR>

#include <cmath>
#include <limits>
#include <optional>
#include <string>

namespace attnscope::analyses {

using detail::Draws;
using Sense = CheckRow::Sense;

namespace {

/// Rows built through a linear solve or a bisection agree to this.
constexpr double kSolvedRows = 1e-10;
/// How many redraws a trial may take to avoid a degenerate row before the check gives up.
constexpr int kMaxRedraws = 100;

const Variant& softmax() {
  static const Variant v = parse_variant("softmax");
  return v;
}

/// |row(p) - row(q)|; also |p - q| in `dist`.
double row_gap(const Variant& v, const VecD& p, const VecD& q, const MatD& k, double scale,
               bool* degenerate = nullptr) {
  MatD x(2, p.size());
  x.row(0) = p.transpose();
  x.row(1) = q.transpose();
  const MatD w = detail::weight_rows(v, x, k, scale, degenerate);
  return (w.row(0) - w.row(1)).norm();
}

/// Keys meeting both rank conditions (under phi for the kernel families): a Gaussian draw meets
/// them almost surely; the check says so instead of assuming it.
MatD generic_keys(Draws& draws, const detail::Shape& s, const FeatureMap* map, bool* ok) {
  const MatD k = draws.matrix(s.n, s.d);
  *ok = detail::rank_conditions(map ? map->apply<double>(k) : k);
  return k;
}

/// Softmax Jacobian dS/dq = s (diag(w) - w w^T) K; its weakest direction is the hardest test of
/// local injectivity.
MatD softmax_jacobian(const VecD& w, const MatD& k, double scale) {
  const MatD d = MatD(w.asDiagonal()) - w * w.transpose();
  return scale * d * k;
}

}  // namespace

CheckRow check_prop1_random(std::uint64_t seed, int trials) {
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row("prop1.random",
                        "softmax, rank(K) = d, rank([K,1]) = d+1: |S(p) - S(q)| for random p != q",
                        kDistinctRows, Sense::Above),
      trials, [&](int t) {
        const auto shape = detail::trial_shape(t);
        bool ok = false;
        const MatD k = generic_keys(draws, shape, nullptr, &ok);
        const VecD p = draws.vector(shape.d), q = draws.vector(shape.d);
        return ok ? row_gap(softmax(), p, q, k, detail::default_scale(shape.d)) : 0.0;
      });
}

CheckRow check_prop1_adversarial(std::uint64_t seed, int trials) {
  CheckRow r = detail::start_row(
      "prop1.adversarial",
      "softmax: |S(p) - S(q)| / |p - q| for q = p + t x, x from K x ~ 1 and the Jacobian's weakest "
      "direction, t = 1e-3, 1",
      kDistinctRows, Sense::Above);
  Draws draws(seed);
  for (int t = 0; t < trials; ++t) {
    const auto shape = detail::trial_shape(t);
    const double scale = detail::default_scale(shape.d);
    bool ok = false;
    const MatD k = generic_keys(draws, shape, nullptr, &ok);
    const VecD p = draws.vector(shape.d);
    const VecD w = detail::weight_row(softmax(), p, k, scale);
    const VecD towards_ones = k.colPivHouseholderQr().solve(VecD::Ones(shape.n)).normalized();
    const VecD weakest = detail::weakest_direction(softmax_jacobian(w, k, scale));
    for (const VecD& x : {towards_ones, weakest}) {
      for (double step : {1e-3, 1.0}) {
        const VecD q = p + step * x;
        detail::fold(r, ok ? row_gap(softmax(), p, q, k, scale) / (q - p).norm() : 0.0);
      }
    }
    ++r.trials;
  }
  r.decide();
  return r;
}

CheckRow check_prop1_hyperplane(std::uint64_t seed, int trials) {
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row(
          "prop1.hyperplane",
          "converse: keys with K x = 1 (rank([K,1]) = d) give S(p) = S(p + t x): max |S(p) - S(q)|",
          kEqualRows, Sense::Below),
      trials, [&](int t) {
        const auto shape = detail::trial_shape(t);
        VecD x0;
        const MatD k = detail::hyperplane_keys(draws, shape.n, shape.d, &x0);
        MatD k1(k.rows(), k.cols() + 1);
        k1 << k, MatD::Ones(k.rows(), 1);
        const bool confined = detail::numerical_rank(k1) == shape.d;
        const VecD p = draws.vector(shape.d);
        const VecD q = p + draws.uniform(0.5, 2.0) * x0;
        const double gap = row_gap(softmax(), p, q, k, detail::default_scale(shape.d));
        return confined ? gap : std::numeric_limits<double>::infinity();
      });
}

CheckRow check_prop2_relu_collinear(std::uint64_t seed, int trials) {
  const Variant v = parse_variant("linear:relu");
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row("prop2.relu_collinear",
                        "linear:relu, q = c p (c > 0, c != 1): max |L(p) - L(q)|", kEqualRows,
                        Sense::Below),
      trials, [&](int t) {
        const auto shape = detail::trial_shape(t);
        return detail::first_usable(kMaxRedraws, [&](int) -> std::optional<double> {
          const MatD k = draws.matrix(shape.n, shape.d);
          const VecD p = draws.vector(shape.d);
          double c = std::exp(draws.uniform(-2.0, 2.0));
          if (std::abs(c - 1.0) < 1e-2) c = 2.0;
          bool degenerate = false;
          const double g = row_gap(v, p, c * p, k, 1.0, &degenerate);
          if (degenerate) return std::nullopt;  // ReLU killed the query or its keys: redraw
          return g;
        });
      });
}

CheckRow check_prop2_identity_negation(std::uint64_t seed, int trials) {
  const Variant v = parse_variant("linear:identity");
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row("prop2.identity_negation",
                        "linear:identity, q = -p: max |L(p) - L(q)| / max(1, |L(p)|)", kEqualRows,
                        Sense::Below),
      trials, [&](int t) {
        const auto shape = detail::trial_shape(t);
        return detail::first_usable(kMaxRedraws, [&](int) -> std::optional<double> {
          const MatD k = draws.matrix(shape.n, shape.d);
          const VecD p = draws.vector(shape.d);
          bool degenerate = false;
          const double g = row_gap(v, p, -p, k, 1.0, &degenerate);
          if (degenerate) return std::nullopt;
          return g / std::max(1.0, detail::weight_row(v, p, k, 1.0).norm());
        });
      });
}

CheckRow check_prop2_relu_affine(std::uint64_t seed, int trials) {
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row("prop2.relu_affine",
                        "linear:relu_affine, q != p of another direction with phi(q) = c phi(p): "
                        "max |L(p) - L(q)|",
                        kSolvedRows, Sense::Below),
      trials, [&](int t) {
        const auto shape = detail::trial_shape(t, 2);  // one dimension has no other direction
        Variant v =
            parse_variant("linear:relu_affine=" + std::to_string(seed + static_cast<unsigned>(t)));
        v.map.ensure_params(shape.d);
        const MatD& A = v.map.A;
        const VecD& b = v.map.b;
        return detail::first_usable(kMaxRedraws, [&](int attempt) -> std::optional<double> {
          // A very negative b can leave ReLU(A x + b) = 0 for most draws: widen them as we retry.
          const double spread = 1.0 + attempt;
          const MatD k = draws.matrix(shape.n, shape.d, spread);
          const VecD p = draws.vector(shape.d, spread);
          const VecD z = A * p + b;
          // ReLU(z') = c ReLU(z): scale the live coordinates by c, move the dead ones within z < 0.
          const double c = std::exp(draws.uniform(-1.0, 1.0));
          VecD target = z;
          for (Eigen::Index i = 0; i < z.size(); ++i) {
            target[i] = z[i] > 0.0 ? c * z[i] : z[i] * draws.uniform(0.5, 2.0);
          }
          const VecD q = A.partialPivLu().solve(target - b);
          const double cosine = p.dot(q) / (p.norm() * q.norm());
          bool degenerate = false;
          const double g = row_gap(v, p, q, k, 1.0, &degenerate);
          // Need a live query and a new direction.
          if (degenerate || !(cosine < 1.0 - 1e-9)) return std::nullopt;
          return g;
        });
      });
}

namespace {

/// Solves phi(q) = y entry by entry by bisection, for an increasing elementwise phi.
VecD invert_elementwise(const FeatureMap& map, const VecD& y) {
  const auto phi = [&](const VecD& x) -> VecD {
    return map.apply<double>(MatD(x.transpose())).row(0).transpose();
  };
  VecD lo = VecD::Constant(y.size(), -1.0), hi = VecD::Constant(y.size(), 1.0);
  for (int i = 0; i < 60 && (phi(lo).array() > y.array()).any(); ++i) {
    lo = (phi(lo).array() > y.array()).select(2.0 * lo, lo);
  }
  for (int i = 0; i < 60 && (phi(hi).array() < y.array()).any(); ++i) {
    hi = (phi(hi).array() < y.array()).select(2.0 * hi, hi);
  }
  for (int i = 0; i < 200; ++i) {
    const VecD mid = 0.5 * (lo + hi);
    const VecD f = phi(mid);
    const Eigen::Array<bool, Eigen::Dynamic, 1> below = f.array() < y.array();
    lo = below.select(mid, lo);
    hi = below.select(hi, mid);
  }
  return 0.5 * (lo + hi);
}

}  // namespace

CheckRow check_lemma1(const std::string& map, std::uint64_t seed, int trials) {
  const Variant v = parse_variant("linear:" + map);
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row(
          "lemma1." + map,
          "linear:" + map +
              " (injective): q found by bisection with phi(q) = alpha phi(p), alpha != 1: "
              "max of |L(p) - L(q)| and |phi(q) - alpha phi(p)| / |alpha phi(p)|",
          kSolvedRows, Sense::Below),
      trials, [&](int t) {
        const auto shape = detail::trial_shape(t);
        const MatD k = draws.matrix(shape.n, shape.d);
        const VecD p = draws.vector(shape.d);
        double alpha = std::exp(draws.uniform(-1.5, 1.5));
        if (std::abs(alpha - 1.0) < 0.05) alpha = 0.5;
        const VecD phi_p = v.map.apply<double>(MatD(p.transpose())).row(0).transpose();
        const VecD q = invert_elementwise(v.map, alpha * phi_p);
        const VecD phi_q = v.map.apply<double>(MatD(q.transpose())).row(0).transpose();
        const double residual = (phi_q - alpha * phi_p).norm() / (alpha * phi_p).norm();
        bool degenerate = false;
        const double gap = row_gap(v, p, q, k, 1.0, &degenerate);
        const bool distinct = (q - p).norm() > 1e-9 * p.norm();
        return degenerate || !distinct ? std::numeric_limits<double>::infinity()
                                       : std::max(gap, residual);
      });
}

namespace {

const char* const kInjectiveMaps[] = {"identity", "leaky_relu", "elu1"};

Variant inline_with(int trial) {
  return parse_variant(std::string("inline:") + kInjectiveMaps[trial % 3]);
}

}  // namespace

CheckRow check_prop3_random(std::uint64_t seed, int trials) {
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row(
          "prop3.random",
          "inline (identity, leaky_relu, elu1), rank conditions on phi(K): |InL(p) - InL(q)| for "
          "random p != q",
          kDistinctRows, Sense::Above),
      trials, [&](int t) {
        const auto shape = detail::trial_shape(t);
        const Variant v = inline_with(t);
        bool ok = false;
        const MatD k = generic_keys(draws, shape, &v.map, &ok);
        const VecD p = draws.vector(shape.d), q = draws.vector(shape.d);
        return ok ? row_gap(v, p, q, k, 1.0) : 0.0;
      });
}

CheckRow check_prop3_collinear(std::uint64_t seed, int trials) {
  CheckRow r = detail::start_row(
      "prop3.collinear",
      "inline: |InL(p) - InL(q)| / |p - q| for the pairs that fool linear attention (q = c p, "
      "q = -p) and, with phi = identity, along the weakest direction of (I - 11^T/N) K",
      kDistinctRows, Sense::Above);
  Draws draws(seed);
  for (int t = 0; t < trials; ++t) {
    const auto shape = detail::trial_shape(t);
    const Variant v = inline_with(t);
    bool ok = false;
    const MatD k = generic_keys(draws, shape, &v.map, &ok);
    const VecD p = draws.vector(shape.d);
    double c = std::exp(draws.uniform(-2.0, 2.0));
    if (std::abs(c - 1.0) < 1e-2) c = 2.0;
    std::vector<VecD> partners{c * p, -p};
    if (v.map.kind == MapKind::Identity) {
      const MatD centred = k.rowwise() - k.colwise().mean();
      partners.push_back(p + 1e-3 * detail::weakest_direction(centred));
    }
    for (const VecD& q : partners) {
      detail::fold(r, ok ? row_gap(v, p, q, k, 1.0) / (q - p).norm() : 0.0);
    }
    ++r.trials;
  }
  r.decide();
  return r;
}

CheckRow check_prop3_hyperplane(std::uint64_t seed, int trials) {
  const Variant v = parse_variant("inline:identity");
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row(
          "prop3.hyperplane",
          "converse: inline:identity with K x = 1 solvable gives InL(p) = InL(p + t x): max gap",
          kEqualRows, Sense::Below),
      trials, [&](int t) {
        const auto shape = detail::trial_shape(t);
        VecD x0;
        const MatD k = detail::hyperplane_keys(draws, shape.n, shape.d, &x0);
        const VecD p = draws.vector(shape.d);
        const VecD q = p + draws.uniform(0.5, 2.0) * x0;
        // Relative to the rows' size: InLine weights grow with |p| |K|.
        const double size = std::max(1.0, detail::weight_row(v, p, k, 1.0).norm());
        return row_gap(v, p, q, k, 1.0) / size;
      });
}

}  // namespace attnscope::analyses
