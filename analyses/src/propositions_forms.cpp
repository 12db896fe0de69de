// Linear-time forms against explicit weights: equality (InLine eq. 5, MALA eq. 13), counted cost
// (the rows) and measured time (information only); and the whole verification run in report
// order.
#include "attnscope/analyses/propositions.hpp"

#include "attnscope/attention.hpp"
#include "attnscope/work_counters.hpp"
#include "propositions_support.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <ctime>
#include <limits>
#include <sstream>

namespace attnscope::analyses {

using detail::Draws;
using Sense = CheckRow::Sense;

void CheckRow::decide() {
  const bool measured = trials > 0 && unusable == 0;
  pass = measured &&
         (sense == Sense::Above ? margin > threshold : margin <= threshold);  // NaN fails both
}

std::string CheckRow::result() const {
  if (trials == 0 || unusable > 0) return "NO DRAW";
  return pass ? "PASS" : "FAIL";
}

CheckRow check_linear_form(const std::string& spec, std::uint64_t seed, int trials,
                           const CheckInputs& in) {
  const Variant v = parse_variant(spec);
  CheckRow r = detail::start_row(
      "linear_form." + v.name(),
      v.name() +
          ": linear-time outputs vs explicit W V, N = 1, 2, 50, 197, d = 1, 7, 64: max "
          "|O_lin - O_exp| / ((|Z| |M|) |V|) entry by entry, W = Z M",
      kIdentityTolerance, Sense::Below);
  static constexpr std::array<int, 4> kN{1, 2, 50, 197};
  static constexpr std::array<int, 3> kD{1, 7, 64};
  Draws draws(seed);
  return detail::run_trials(std::move(r), trials, [&](int t) {
    const int n = kN[static_cast<std::size_t>(t) % kN.size()];
    const int d = kD[static_cast<std::size_t>(t / static_cast<int>(kN.size())) % kD.size()];
    const double scale = detail::default_scale(d);
    const MatD q = draws.matrix(n, d), k = draws.matrix(n, d), values = draws.matrix(n, d);
    const MatD fast = in.outputs ? in.outputs(v, q, k, values, scale)
                                 : attention_outputs<double>(v, q, k, values, scale);
    const MatD slow = attention_outputs_explicit<double>(v, q, k, values, scale);
    // Rounding grows with the terms the linear-time form adds before they cancel, not with the
    // (possibly much smaller) weights: measure against (|Z| |M|) |V|, where W = Z M.
    const LowRankForm lr = low_rank_form<double>(v, q, k, scale);
    const MatD size = (lr.Z.cwiseAbs() * lr.M.cwiseAbs()) * values.cwiseAbs();
    const double tiny = std::numeric_limits<double>::min();
    return (fast - slow).cwiseAbs().cwiseQuotient(size.cwiseMax(tiny)).maxCoeff();
  });
}

FormWork count_form_work(const std::string& spec, bool linear_time, const std::vector<int>& sizes,
                         int dim, std::uint64_t seed, const CheckInputs& in) {
  const Variant v = parse_variant(spec);
  FormWork w;
  w.variant = v.name();
  w.form = linear_time ? "linear_time" : "explicit";
  w.dim = dim;
  w.sizes = sizes;
  Draws draws(seed);
  const double scale = detail::default_scale(dim);
  const auto form = [&](const MatD& q, const MatD& k, const MatD& values) -> MatD {
    if (in.outputs) return in.outputs(v, q, k, values, scale);
    return linear_time ? attention_outputs<double>(v, q, k, values, scale)
                       : attention_outputs_explicit<double>(v, q, k, values, scale);
  };
  for (int n : sizes) {
    const MatD q = draws.matrix(n, dim), k = draws.matrix(n, dim), values = draws.matrix(n, dim);
    const WorkCounters before = thread_work_counters();
    form(q, k, values);
    const WorkCounters first = thread_work_counters();
    form(q, k, values);  // the same size again: the scratch must be reused
    const WorkCounters second = thread_work_counters();
    w.multiply_adds.push_back(static_cast<double>(first.multiply_adds - before.multiply_adds));
    w.scratch_growths_on_repeat +=
        static_cast<long>(second.scratch_growths - first.scratch_growths);
  }
  return w;
}

CheckRow cost_row(const FormWork& w) {
  const bool linear = w.form == "linear_time";
  std::ostringstream what;
  what << w.variant << ": multiply-adds counted by the library in the " << w.form
       << " form over N = " << w.sizes.front() << ".." << w.sizes.back() << ", d = " << w.dim
       << ", fitted exponent of N"
       << (linear ? "; a repeated call of one size must allocate no scratch" : "");
  CheckRow r = detail::start_row("cost." + w.variant + "." + w.form, what.str(),
                                 linear ? 1.01 : 1.9, linear ? Sense::Below : Sense::Above);
  std::vector<double> n(w.sizes.begin(), w.sizes.end());
  const bool counted =
      std::all_of(w.multiply_adds.begin(), w.multiply_adds.end(), [](double c) { return c > 0.0; });
  // A form that counted nothing was not measured; scratch allocated on a repeated call is a
  // failure of the linear-time form (a NaN margin fails either sense).
  double margin = fit_power_law(n, w.multiply_adds).exponent;
  if (linear && w.scratch_growths_on_repeat > 0) margin = std::numeric_limits<double>::quiet_NaN();
  detail::count_trial(
      r, counted && w.sizes.size() >= 2 ? std::optional<double>(margin) : std::nullopt);
  r.trials = static_cast<long>(w.sizes.size());
  if (r.unusable > 0) r.unusable = r.trials;
  detail::finish(r);
  return r;
}

PowerLawFit fit_power_law(const std::vector<double>& n, const std::vector<double>& cost) {
  PowerLawFit fit;
  const std::size_t m = std::min(n.size(), cost.size());
  if (m < 2) return fit;
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < m; ++i) {
    const double x = std::log(n[i]), y = std::log(cost[i]);
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  const double dm = static_cast<double>(m);
  fit.exponent = (dm * sxy - sx * sy) / (dm * sxx - sx * sx);
  const double intercept = (sy - fit.exponent * sx) / dm;
  fit.prefactor = std::exp(intercept);
  double ss_res = 0, ss_tot = 0;
  for (std::size_t i = 0; i < m; ++i) {
    const double x = std::log(n[i]), y = std::log(cost[i]);
    ss_res += std::pow(y - (intercept + fit.exponent * x), 2);
    ss_tot += std::pow(y - sy / dm, 2);
  }
  fit.r2 = ss_tot > 0 ? 1.0 - ss_res / ss_tot : 1.0;
  return fit;
}

namespace {

/// CPU seconds of the calling thread: what the work costs, whatever else the machine runs
/// (equal to wall-clock on an idle machine with one thread).
double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// Seconds per call: calls are batched until a batch lasts at least kMinBatch (so that clock
/// resolution does not dominate small sizes), and the best of `repeats` batches is kept.
template <typename F>
double best_seconds(int repeats, F&& f) {
  constexpr double kMinBatch = 0.02;
  f();  // warm-up: first-touch allocations
  long calls = 1;
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < std::max(1, repeats);) {
    const double start = thread_seconds();
    for (long i = 0; i < calls; ++i) f();
    const double dt = thread_seconds() - start;
    if (dt < kMinBatch && calls < (1L << 20)) {
      calls *= 2;  // too short to trust: grow the batch and measure again
      continue;
    }
    best = std::min(best, dt / static_cast<double>(calls));
    ++r;
  }
  return best;
}

/// Runs Eigen single-threaded for the lifetime of the guard: a per-thread clock must see all
/// the work, and the exponent must reflect work rather than thread scheduling.
class SingleThreadEigen {
 public:
  SingleThreadEigen() : saved_(Eigen::nbThreads()) { Eigen::setNbThreads(1); }
  ~SingleThreadEigen() { Eigen::setNbThreads(saved_); }
  SingleThreadEigen(const SingleThreadEigen&) = delete;
  SingleThreadEigen& operator=(const SingleThreadEigen&) = delete;

 private:
  int saved_;
};

}  // namespace

FormTiming time_forms(const std::string& spec, const std::vector<int>& sizes, int dim, int repeats,
                      std::uint64_t seed) {
  const Variant v = parse_variant(spec);
  FormTiming t;
  t.variant = v.name();
  t.dim = dim;
  t.sizes = sizes;
  Draws draws(seed);
  const double scale = detail::default_scale(dim);
  const SingleThreadEigen one_thread;
  for (int n : sizes) {
    const MatF q = draws.matrix(n, dim).cast<float>(), k = draws.matrix(n, dim).cast<float>(),
               values = draws.matrix(n, dim).cast<float>();
    // The sink keeps the work from being optimised away.
    volatile float sink = 0.0f;
    t.linear_s.push_back(best_seconds(
        repeats, [&] { sink = sink + attention_outputs<float>(v, q, k, values, scale)(0, 0); }));
    t.explicit_s.push_back(best_seconds(repeats, [&] {
      sink = sink + attention_outputs_explicit<float>(v, q, k, values, scale)(0, 0);
    }));
  }
  std::vector<double> n(sizes.begin(), sizes.end());
  t.linear_fit = fit_power_law(n, t.linear_s);
  t.explicit_fit = fit_power_law(n, t.explicit_s);
  return t;
}

std::vector<std::string> linear_form_specs() {
  std::vector<std::string> out;
  for (const AttentionFamily* family : all_families()) {
    // verify draws q and k alone: families that need per-layer data are checked by their tests.
    if (!family->kernel() || parse_variant(example_spec(*family)).needs_params()) continue;
    for (const char* convention : {"@paper", "@code"}) out.push_back(example_spec(*family) + convention);
  }
  return out;
}

std::vector<CheckRow> verify_all(const VerifyOptions& o) {
  std::vector<CheckRow> rows;
  std::uint64_t salt = 0;
  const auto seed = [&] { return detail::derive_seed(o.seed, salt++); };
  rows.push_back(check_prop1_random(seed(), o.trials));
  rows.push_back(check_prop1_adversarial(seed(), o.trials));
  rows.push_back(check_prop1_hyperplane(seed(), o.trials));
  rows.push_back(check_prop2_relu_collinear(seed(), o.trials));
  rows.push_back(check_prop2_identity_negation(seed(), o.trials));
  rows.push_back(check_prop2_relu_affine(seed(), o.trials));
  rows.push_back(check_lemma1("leaky_relu", seed(), o.trials));
  rows.push_back(check_lemma1("elu1", seed(), o.trials));
  rows.push_back(check_prop3_random(seed(), o.trials));
  rows.push_back(check_prop3_collinear(seed(), o.trials));
  rows.push_back(check_prop3_hyperplane(seed(), o.trials));
  rows.push_back(check_mala_rows_sum(seed(), o.trials));
  rows.push_back(check_mala_eq11(seed(), o.trials));
  rows.push_back(check_mala_eq19(seed(), o.trials));
  rows.push_back(check_mala_eq22(seed(), o.trials));
  rows.push_back(check_mala_eq22_counterexample(seed(), o.trials));
  for (const std::string& spec : linear_form_specs()) rows.push_back(check_linear_form(spec, seed(), o.trials));
  for (const char* spec : {"inline@code", "mala@code"}) {
    const std::uint64_t s = seed();
    for (bool linear_time : {true, false}) {
      rows.push_back(cost_row(count_form_work(spec, linear_time, o.work_sizes, o.work_dim, s)));
    }
  }
  if (o.timing) {
    for (const char* spec : {"inline@code", "mala@code"}) {
      const FormTiming t = time_forms(spec, o.timing_sizes, o.timing_dim, o.timing_repeats, seed());
      if (o.timings != nullptr) o.timings->push_back(t);
    }
  }
  return rows;
}

}  // namespace attnscope::analyses
