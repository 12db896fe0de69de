// InLine's Propositions 1-3 and Lemma 1, checked by numbers (propositions.hpp).
#include "attnscope/analyses/propositions.hpp"

#include "attnscope/attention.hpp"
#include "attnscope/portable_math.hpp"
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
using detail::kMaxRedraws;

/// |row(p) - row(q)|.
double row_gap(const CheckInputs& in, const Variant& v, const VecD& p, const VecD& q, const MatD& k,
               double scale, bool* degenerate = nullptr) {
  MatD x(2, p.size());
  x.row(0) = p.transpose();
  x.row(1) = q.transpose();
  const MatD w = detail::weight_rows(in, v, x, k, scale, degenerate);
  return (w.row(0) - w.row(1)).norm();
}

/// The keys that the variant's weights see: the key features f_k for the kernel families.
MatD seen_keys(const Variant& v, const MatD& k) {
  return v.kernel() ? kernel_features(v, k, k, 1.0).k : k;
}

/// Keys meeting both rank conditions (under phi for the kernel families), redrawn until they do:
/// a Gaussian draw meets them almost surely, and the check tests it instead of assuming it.
/// nullopt when no draw did (the trial is unusable).
std::optional<MatD> generic_keys(Draws& draws, const detail::Shape& s, const Variant& v,
                                 const CheckInputs& in) {
  return detail::first_usable(kMaxRedraws, [&](int) -> std::optional<MatD> {
    MatD k = detail::draw_keys(draws, in, s.n, s.d);
    if (!in.skip_hypothesis && !detail::rank_conditions(seen_keys(v, k))) return std::nullopt;
    return k;
  });
}

/// Keys for which K x = 1 is solvable (rank([K, 1]) = d, checked), and that x: the converse of
/// Prop. 1 and 3. nullopt when no draw met it.
std::optional<std::pair<MatD, VecD>> confined_keys(Draws& draws, const detail::Shape& s,
                                                   const CheckInputs& in) {
  return detail::first_usable(kMaxRedraws, [&](int) -> std::optional<std::pair<MatD, VecD>> {
    VecD x0;
    MatD k =
        in.keys ? in.keys(s.n, s.d, draws.bits()) : detail::hyperplane_keys(draws, s.n, s.d, &x0);
    if (in.keys) x0 = detail::solve_ones(k);
    MatD k1(k.rows(), k.cols() + 1);
    k1 << k, MatD::Ones(k.rows(), 1);
    if (!in.skip_hypothesis && detail::numerical_rank(k1) != s.d) return std::nullopt;
    return std::pair{std::move(k), std::move(x0)};
  });
}

/// Softmax Jacobian dS/dq = s (diag(w) - w w^T) K; its weakest direction is the hardest test of
/// local injectivity.
MatD softmax_jacobian(const VecD& w, const MatD& k, double scale) {
  const MatD d = MatD(w.asDiagonal()) - w * w.transpose();
  return scale * d * k;
}

}  // namespace

CheckRow check_prop1_random(std::uint64_t seed, int trials, const CheckInputs& in) {
  const Variant v = detail::check_variant(in, "softmax", "");
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row("prop1.random",
                        "softmax, rank(K) = d, rank([K,1]) = d+1: |S(p) - S(q)| for random p != q",
                        kDistinctRows, Sense::Above),
      trials, [&](int t) -> std::optional<double> {
        const auto shape = detail::trial_shape(t);
        const std::optional<MatD> k = generic_keys(draws, shape, v, in);
        const VecD p = draws.vector(shape.d), q = draws.vector(shape.d);
        if (!k) return std::nullopt;
        const double scale = detail::default_scale(shape.d);
        return row_gap(in, v, p, in.partner ? in.partner(p, *k) : q, *k, scale);
      });
}

CheckRow check_prop1_adversarial(std::uint64_t seed, int trials, const CheckInputs& in) {
  const Variant v = detail::check_variant(in, "softmax", "");
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row("prop1.adversarial",
                        "softmax: |S(p) - S(q)| / |p - q| for q = p + t x, x from K x ~ 1 and the "
                        "Jacobian's weakest direction, t = 1e-3, 1",
                        kDistinctRows, Sense::Above),
      trials, [&](int t) -> std::optional<double> {
        const auto shape = detail::trial_shape(t);
        const double scale = detail::default_scale(shape.d);
        const std::optional<MatD> k = generic_keys(draws, shape, v, in);
        const VecD p = draws.vector(shape.d);
        if (!k) return std::nullopt;
        const VecD w = detail::weight_row(in, v, p, *k, scale);
        const VecD towards_ones = detail::solve_ones(*k).normalized();
        const VecD weakest = detail::weakest_direction(softmax_jacobian(w, *k, scale));
        double worst = std::numeric_limits<double>::infinity();
        for (const VecD& x : {towards_ones, weakest}) {
          for (double step : {1e-3, 1.0}) {
            const VecD q = p + step * x;
            const double ratio = row_gap(in, v, p, q, *k, scale) / (q - p).norm();
            worst = std::isnan(ratio) ? ratio : std::min(worst, ratio);
          }
        }
        return worst;
      });
}

CheckRow check_prop1_hyperplane(std::uint64_t seed, int trials, const CheckInputs& in) {
  const Variant v = detail::check_variant(in, "softmax", "");
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row(
          "prop1.hyperplane",
          "converse: keys with K x = 1 (rank([K,1]) = d) give S(p) = S(p + t x): max |S(p) - S(q)|",
          kEqualRows, Sense::Below),
      trials, [&](int t) -> std::optional<double> {
        const auto shape = detail::trial_shape(t);
        const auto keys = confined_keys(draws, shape, in);
        const VecD p = draws.vector(shape.d);
        const double step = draws.uniform(0.5, 2.0);
        if (!keys) return std::nullopt;
        const auto& [k, x0] = *keys;
        const VecD q = in.partner ? in.partner(p, k) : VecD(p + step * x0);
        return row_gap(in, v, p, q, k, detail::default_scale(shape.d));
      });
}

CheckRow check_prop2_relu_collinear(std::uint64_t seed, int trials, const CheckInputs& in) {
  const Variant v = detail::check_variant(in, "linear", ":relu");
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row("prop2.relu_collinear",
                        "linear:relu, q = c p (c > 0, c != 1): max |L(p) - L(q)|", kEqualRows,
                        Sense::Below),
      trials, [&](int t) {
        const auto shape = detail::trial_shape(t);
        return detail::first_usable(kMaxRedraws, [&](int) -> std::optional<double> {
          const MatD k = detail::draw_keys(draws, in, shape.n, shape.d);
          const VecD p = draws.vector(shape.d);
          double c = portable::exp(draws.uniform(-2.0, 2.0));
          if (std::abs(c - 1.0) < 1e-2) c = 2.0;
          bool degenerate = false;
          const VecD q = in.partner ? in.partner(p, k) : VecD(c * p);
          const double g = row_gap(in, v, p, q, k, 1.0, &degenerate);
          if (degenerate) return std::nullopt;  // ReLU killed the query or its keys: redraw
          return g;
        });
      });
}

CheckRow check_prop2_identity_negation(std::uint64_t seed, int trials, const CheckInputs& in) {
  const Variant v = detail::check_variant(in, "linear", ":identity");
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row("prop2.identity_negation",
                        "linear:identity, q = -p: max |L(p) - L(q)| / max(1, |L(p)|)", kEqualRows,
                        Sense::Below),
      trials, [&](int t) {
        const auto shape = detail::trial_shape(t);
        return detail::first_usable(kMaxRedraws, [&](int) -> std::optional<double> {
          const MatD k = detail::draw_keys(draws, in, shape.n, shape.d);
          const VecD p = draws.vector(shape.d);
          bool degenerate = false;
          const VecD q = in.partner ? in.partner(p, k) : VecD(-p);
          const double g = row_gap(in, v, p, q, k, 1.0, &degenerate);
          if (degenerate) return std::nullopt;
          return g / std::max(1.0, detail::weight_row(in, v, p, k, 1.0).norm());
        });
      });
}

CheckRow check_prop2_relu_affine(std::uint64_t seed, int trials, const CheckInputs& in) {
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row("prop2.relu_affine",
                        "linear:relu_affine, q != p of another direction with phi(q) = c phi(p): "
                        "max |L(p) - L(q)|",
                        kSolvedRows, Sense::Below),
      trials, [&](int t) {
        const auto shape = detail::trial_shape(t, 2);  // one dimension has no other direction
        const std::string map = ":relu_affine=" + std::to_string(seed + static_cast<unsigned>(t));
        Variant v = detail::check_variant(in, "linear", map);
        FeatureMap phi = parse_feature_map(map.substr(1));  // the construction's map, whatever v
        phi.ensure_params(shape.d);
        if (v.uses_map()) v.map = phi;
        const MatD& A = phi.A;
        const VecD& b = phi.b;
        return detail::first_usable(kMaxRedraws, [&](int attempt) -> std::optional<double> {
          // A very negative b can leave ReLU(A x + b) = 0 for most draws: widen them as we retry.
          const double spread = 1.0 + attempt;
          const MatD k = in.keys ? detail::draw_keys(draws, in, shape.n, shape.d)
                                 : draws.matrix(shape.n, shape.d, spread);
          const VecD p = draws.vector(shape.d, spread);
          const VecD z = A * p + b;
          // ReLU(z') = c ReLU(z): scale the live coordinates by c, move the dead ones within z < 0.
          const double c = portable::exp(draws.uniform(-1.0, 1.0));
          VecD target = z;
          for (Eigen::Index i = 0; i < z.size(); ++i) {
            target[i] = z[i] > 0.0 ? c * z[i] : z[i] * draws.uniform(0.5, 2.0);
          }
          const VecD q = in.partner ? in.partner(p, k) : VecD(A.partialPivLu().solve(target - b));
          const double cosine = p.dot(q) / (p.norm() * q.norm());
          bool degenerate = false;
          const double g = row_gap(in, v, p, q, k, 1.0, &degenerate);
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

CheckRow check_lemma1(const std::string& map, std::uint64_t seed, int trials,
                      const CheckInputs& in) {
  const Variant v = detail::check_variant(in, "linear", ":" + map);
  const FeatureMap phi = parse_feature_map(map);  // the construction's map, whatever v
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row(
          "lemma1." + map,
          "linear:" + map +
              " (injective): q found by bisection with phi(q) = alpha phi(p), alpha != 1: "
              "max of |L(p) - L(q)| and |phi(q) - alpha phi(p)| / |alpha phi(p)|",
          kSolvedRows, Sense::Below),
      trials, [&](int t) -> std::optional<double> {
        const auto shape = detail::trial_shape(t);
        const MatD k = detail::draw_keys(draws, in, shape.n, shape.d);
        const VecD p = draws.vector(shape.d);
        double alpha = portable::exp(draws.uniform(-1.5, 1.5));
        if (std::abs(alpha - 1.0) < 0.05) alpha = 0.5;
        const VecD phi_p = phi.apply<double>(MatD(p.transpose())).row(0).transpose();
        const VecD q = in.partner ? in.partner(p, k) : invert_elementwise(phi, alpha * phi_p);
        const VecD phi_q = phi.apply<double>(MatD(q.transpose())).row(0).transpose();
        const double residual = (phi_q - alpha * phi_p).norm() / (alpha * phi_p).norm();
        bool degenerate = false;
        const double gap = row_gap(in, v, p, q, k, 1.0, &degenerate);
        const bool distinct = (q - p).norm() > 1e-9 * p.norm();
        if (degenerate || !distinct) return std::nullopt;
        return std::max(gap, residual);
      });
}

namespace {

const char* const kInjectiveMaps[] = {"identity", "leaky_relu", "elu1"};

Variant inline_with(const CheckInputs& in, int trial) {
  return detail::check_variant(in, "inline", std::string(":") + kInjectiveMaps[trial % 3]);
}

}  // namespace

CheckRow check_prop3_random(std::uint64_t seed, int trials, const CheckInputs& in) {
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row(
          "prop3.random",
          "inline (identity, leaky_relu, elu1), rank conditions on phi(K): |InL(p) - InL(q)| for "
          "random p != q",
          kDistinctRows, Sense::Above),
      trials, [&](int t) -> std::optional<double> {
        const auto shape = detail::trial_shape(t);
        const Variant v = inline_with(in, t);
        const std::optional<MatD> k = generic_keys(draws, shape, v, in);
        const VecD p = draws.vector(shape.d), q = draws.vector(shape.d);
        if (!k) return std::nullopt;
        return row_gap(in, v, p, in.partner ? in.partner(p, *k) : q, *k, 1.0);
      });
}

CheckRow check_prop3_collinear(std::uint64_t seed, int trials, const CheckInputs& in) {
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row(
          "prop3.collinear",
          "inline: |InL(p) - InL(q)| / |p - q| for the pairs that fool linear attention (q = c p, "
          "q = -p) and, with phi = identity, along the weakest direction of (I - 11^T/N) K",
          kDistinctRows, Sense::Above),
      trials, [&](int t) -> std::optional<double> {
        const auto shape = detail::trial_shape(t);
        const Variant v = inline_with(in, t);
        const std::optional<MatD> k = generic_keys(draws, shape, v, in);
        const VecD p = draws.vector(shape.d);
        double c = portable::exp(draws.uniform(-2.0, 2.0));
        if (std::abs(c - 1.0) < 1e-2) c = 2.0;
        if (!k) return std::nullopt;
        std::vector<VecD> partners{c * p, -p};
        if (v.map.kind == MapKind::Identity) {
          const MatD centred = k->rowwise() - k->colwise().mean();
          partners.push_back(p + 1e-3 * detail::weakest_direction(centred));
        }
        double worst = std::numeric_limits<double>::infinity();
        for (const VecD& q : partners) {
          const double ratio = row_gap(in, v, p, q, *k, 1.0) / (q - p).norm();
          worst = std::isnan(ratio) ? ratio : std::min(worst, ratio);
        }
        return worst;
      });
}

CheckRow check_prop3_hyperplane(std::uint64_t seed, int trials, const CheckInputs& in) {
  const Variant v = detail::check_variant(in, "inline", ":identity");
  Draws draws(seed);
  return detail::run_trials(
      detail::start_row("prop3.hyperplane",
                        "converse: inline:identity with K x = 1 solvable (rank([K,1]) = d) gives "
                        "InL(p) = InL(p + t x): max gap / max(1, |InL(p)|)",
                        kEqualRows, Sense::Below),
      trials, [&](int t) -> std::optional<double> {
        const auto shape = detail::trial_shape(t);
        const auto keys = confined_keys(draws, shape, in);
        const VecD p = draws.vector(shape.d);
        const double step = draws.uniform(0.5, 2.0);
        if (!keys) return std::nullopt;
        const auto& [k, x0] = *keys;
        const VecD q = in.partner ? in.partner(p, k) : VecD(p + step * x0);
        // Relative to the rows' size: InLine weights grow with |p| |K|.
        const double size = std::max(1.0, detail::weight_row(in, v, p, k, 1.0).norm());
        return row_gap(in, v, p, q, k, 1.0) / size;
      });
}

}  // namespace attnscope::analyses
