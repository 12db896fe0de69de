// One query's magnitude sweep, and the laws it is checked against.
#include "attnscope/analyses/spikiness.hpp"

#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"
#include "attnscope/portable_math.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>

namespace attnscope::analyses {

MalaTerms mala_terms(const Variant& v, const VecD& phi_q, const MatD& phi_k) {
  const KernelFamily* family = v.kernel();
  if (!family) throw std::logic_error("mala_terms: " + v.name() + " has no kernel form");
  MalaTerms t;
  t.scores = phi_k * phi_q;
  // beta and gamma are the family's row form at this S: a = beta, b = -gamma. Magnitude 0: only
  // S = 0 (or NaN) is degenerate, where beta = 1 + 1/S would not be finite.
  const RowForm rf =
      family->variant_row_form(v, t.scores.sum(), static_cast<int>(phi_k.rows()), 0.0);
  t.beta = rf.degenerate ? std::numeric_limits<double>::infinity() : rf.a;
  t.gamma = rf.degenerate ? 0.0 : -rf.b;
  return t;
}

HeadSweeper::HeadSweeper(const Variant& v, const MatD& k, double scale, SpikinessOptions opts,
                         const MatF* head_queries)
    : variant_(v),
      keys_(k),
      scale_(scale),
      opts_(std::move(opts)),
      space_(effective_space(v, opts_.space)) {
  const KernelFamily* family = v.kernel();
  if (!family) {
    max_key_norm_ = k.rowwise().norm().maxCoeff();
    return;
  }
  variant_.map.ensure_params(static_cast<int>(k.cols()));
  homogeneous_ = family->query_features_homogeneous(variant_);
  // The key side only (the queries' own features are not needed): f_k and, for a family whose
  // row form has normaliser features of its own, g_k; the head's queries for a family whose keys
  // read them (RALA's mean query).
  const MatD queries = head_queries ? MatD(head_queries->cast<double>()) : MatD(0, k.cols());
  keys_.resize(k.rows(), family->feature_dim(variant_, static_cast<int>(k.cols())));
  family->key_features(variant_, queries, k, scale, keys_);
  require_finite_keys(keys_, "key");
  separate_ = family->separate_normaliser(variant_);
  if (separate_) {
    norm_keys_.resize(k.rows(), family->normaliser_dim(variant_, static_cast<int>(k.cols())));
    family->normaliser_key_features(variant_, queries, k, scale, norm_keys_);
    require_finite_keys(norm_keys_, "key normaliser");
  }
}

void HeadSweeper::require_finite_keys(const MatD& f, const char* what) const {
  for (Eigen::Index j = 0; j < f.rows(); ++j) {
    if (!f.row(j).allFinite()) {
      throw NumericalError(variant_.name() + ": " + what + " features of row " + std::to_string(j) +
                           " are not finite (overflow or non-finite input)");
    }
  }
}

MatD HeadSweeper::rows(const VecD& q, Eigen::Index token, VecD& f_one) const {
  const auto n_scales = static_cast<Eigen::Index>(opts_.scales.size());
  const auto scaled = [&](const VecD& x) {  // row 0 is a = 1 (the reference keys are chosen there)
    MatD out(n_scales + 1, x.size());
    out.row(0) = x.transpose();
    for (Eigen::Index s = 0; s < n_scales; ++s) {
      out.row(s + 1) = opts_.scales[static_cast<std::size_t>(s)] * x.transpose();
    }
    return out;
  };
  if (variant_.form() == Form::Score)
    return attention_weights<double>(variant_, scaled(q), keys_, scale_);
  // Every row is at the query's own token position: only its magnitude changes.
  const TokenPositions at_token{token, 0};
  if (space_ == ScaleSpace::Feature) {
    f_one = query_features(variant_, q.transpose(), at_token, keys_.rows(), scale_).row(0).transpose();
    if (separate_) {
      const VecD g_one =
          normaliser_query_features(variant_, q.transpose(), at_token, keys_.rows(), scale_)
              .row(0)
              .transpose();
      return kernel_weights(variant_, scaled(f_one), keys_, scaled(g_one), norm_keys_);
    }
    return kernel_weights(variant_, scaled(f_one), keys_);
  }
  const MatD f = query_features(variant_, scaled(q), at_token, keys_.rows(), scale_);
  f_one = f.row(0).transpose();
  if (separate_) {
    return kernel_weights(
        variant_, f, keys_,
        normaliser_query_features(variant_, scaled(q), at_token, keys_.rows(), scale_), norm_keys_);
  }
  return kernel_weights(variant_, f, keys_);
}

std::vector<LawResult> HeadSweeper::laws() const {
  std::vector<LawResult> out;
  for (Law law : variant_.family->magnitude_laws()) {
    LawResult r;
    r.variant = variant_.name();
    r.law = law;
    r.threshold = kLawTolerance;
    if (variant_.form() == Form::Kernel && space_ == ScaleSpace::Query && !homogeneous_) {
      r.applicable = false;
      r.why = "query-space scaling where the query features are not positively homogeneous (" +
              variant_.name() + "): f(a q) != a f(q)";
    } else if (separate_ && (law == Law::MalaRatio || law == Law::MalaBetaGamma)) {
      r.applicable = false;
      r.why =
          "the row form's S comes from normaliser features of its own (" + variant_.name() +
          ": RoPE in the numerator only), not from the scores the law's beta, gamma are read from";
    }
    out.push_back(std::move(r));
  }
  return out;
}

QuerySweep HeadSweeper::sweep(const VecD& q, Eigen::Index token, bool keep_weights,
                              std::vector<LawResult>* laws) const {
  VecD f_one;
  const MatD w = rows(q, token, f_one);
  const VecD w1 = w.row(0).transpose();
  const auto n_scales = static_cast<Eigen::Index>(opts_.scales.size());

  QuerySweep out;
  out.key_high = opts_.keys.high.resolve(w1);
  out.key_low = opts_.keys.low.resolve(w1);
  for (Eigen::Index s = 0; s < n_scales; ++s) {
    const VecD ws = w.row(s + 1).transpose();
    SweepPoint p;
    p.scale = opts_.scales[static_cast<std::size_t>(s)];
    p.ratio = ws[out.key_high] / ws[out.key_low];
    p.stats = row_stats(ws, opts_.topk);
    out.points.push_back(p);
    if (keep_weights) out.weights.push_back(ws);
  }
  if (laws != nullptr) check_laws(q, f_one, w, w1, out.key_high, out.key_low, *laws);
  return out;
}

namespace {

/// What every law sees of one query: the rows at a = 1 and at the scale, the reference keys, and
/// (MALA) the terms at a = 1 with the convention's factor in phi(q).
struct LawInputs {
  const Variant& variant;
  const VecD& w1;
  int hi = 0;
  int lo = 0;
  const MalaTerms& t;
  const VecD& phi_q;
  const MatD& phi_keys;
  double logit_error = 0.0;  ///< softmax: rounding bound of one logit at a = 1
};

/// Softmax weights that the law can be read from: normal doubles (a subnormal weight has lost
/// relative precision, so its logarithm is off by up to ~1).
bool resolvable(double w) { return w >= std::numeric_limits<double>::min(); }

/// Lower weight at (or, relative to the row, within kPoleGuard of) zero: the ratio is rounding.
bool near_pole(const VecD& w, int lo) {
  return !(std::abs(w[lo]) > kPoleGuard * w.cwiseAbs().maxCoeff());
}

/// The deviation of one (query, scale) from the law, or nullopt when it has no trustworthy value.
std::optional<double> deviation(Law law, const LawInputs& in, double a, const VecD& ws) {
  const int hi = in.hi, lo = in.lo;
  switch (law) {
    case Law::SoftmaxPower: {
      if (!(resolvable(ws[lo]) && resolvable(ws[hi]) && resolvable(in.w1[lo]) && resolvable(in.w1[hi]))) {
        return std::nullopt;  // underflow
      }
      const double lnp = portable::log(in.w1[hi]) - portable::log(in.w1[lo]);
      const double lnr = portable::log(ws[hi]) - portable::log(ws[lo]);
      const double norm = std::max(1.0, std::abs(a * lnp));
      // lnr and a lnp each difference two logits, off by at most a logit_error apiece: where that
      // is not far below the tolerance (logits near 1e77 carry errors far above 1), the point
      // says nothing about the law.
      if (!(4.0 * (1.0 + a) * in.logit_error <= kLawTolerance / 16.0 * norm)) return std::nullopt;
      return std::abs(lnr - a * lnp) / norm;
    }
    case Law::LinearInvariant: {
      if (near_pole(ws, lo) || near_pole(in.w1, lo)) return std::nullopt;
      const double r1 = in.w1[hi] / in.w1[lo], ra = ws[hi] / ws[lo];
      // The higher key's weight at zero (relu cut it off; --keys bottom,top): r is 0 at every
      // scale where the law holds, and r(a) / r(1) would be 0 / 0. Compared absolutely there, as
      // softmax_power is near 0: a ratio that leaves 0 still fails.
      if (near_pole(ws, hi) || near_pole(in.w1, hi)) {
        return std::abs(ra - r1) / std::max({1.0, std::abs(r1), std::abs(ra)});
      }
      return std::abs(ra / r1 - 1.0);
    }
    case Law::InlineAffine: {
      const double n = static_cast<double>(ws.size());
      const VecD predicted = (a * (in.w1.array() - 1.0 / n) + 1.0 / n).matrix();
      return (ws - predicted).cwiseAbs().maxCoeff() / std::max(ws.cwiseAbs().maxCoeff(), 1.0 / n);
    }
    case Law::MalaRatio: {
      const MalaTerms& t = in.t;
      const double x = a * t.beta / (t.beta + a - 1.0);
      const double pm =
          (t.beta * t.scores[hi] - x * t.gamma) / (t.beta * t.scores[lo] - x * t.gamma);
      if (near_pole(ws, lo) || !std::isfinite(pm)) return std::nullopt;
      return std::abs(ws[hi] / ws[lo] - pm) / std::max(1.0, std::abs(pm));
    }
    case Law::MalaBetaGamma: {
      const MalaTerms ta = mala_terms(in.variant, VecD(a * in.phi_q), in.phi_keys);
      if (!std::isfinite(ta.beta) || ta.gamma == 0.0) return std::nullopt;
      const double beta_pred = (in.t.beta + a - 1.0) / a, gamma_pred = a * in.t.gamma;
      return std::max(std::abs(ta.beta - beta_pred) / std::abs(ta.beta),
                      std::abs(ta.gamma - gamma_pred) / std::abs(ta.gamma));
    }
  }
  return std::nullopt;
}

}  // namespace

void HeadSweeper::check_laws(const VecD& q, const VecD& f_one, const MatD& w, const VecD& w1, int hi,
                             int lo, std::vector<LawResult>& laws) const {
  // The MALA laws read the terms at a = 1; no other law does.
  const bool mala = std::any_of(laws.begin(), laws.end(), [](const LawResult& r) {
    return r.applicable && (r.law == Law::MalaRatio || r.law == Law::MalaBetaGamma);
  });
  const MalaTerms t = mala ? mala_terms(variant_, f_one, keys_) : MalaTerms{};
  double logit_error = 0.0;
  if (variant_.form() == Form::Score) {
    // The logits s q.k_j are sums of d products: each is off by at most (d + 2) u |s| |q| max|k_j|.
    constexpr double kDoubleUnit = 0x1.0p-53;
    logit_error =
        static_cast<double>(q.size() + 2) * kDoubleUnit * std::abs(scale_) * q.norm() * max_key_norm_;
  }
  const LawInputs in{variant_, w1, hi, lo, t, f_one, keys_, logit_error};
  for (LawResult& r : laws) {
    if (!r.applicable) continue;
    ++r.queries;
    for (std::size_t s = 0; s < opts_.scales.size(); ++s) {
      const VecD ws = w.row(static_cast<Eigen::Index>(s) + 1).transpose();
      const std::optional<double> dev = deviation(r.law, in, opts_.scales[s], ws);
      if (!dev) {
        ++r.skipped;
        continue;
      }
      // NaN must never hide inside a std::max: a deviation that is not a number is infinite.
      r.max_deviation = std::max(r.max_deviation,
                                 std::isnan(*dev) ? std::numeric_limits<double>::infinity() : *dev);
      ++r.points;
    }
  }
}

}  // namespace attnscope::analyses
