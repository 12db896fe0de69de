// One query's magnitude sweep, and the laws it is checked against.
#include "attnscope/analyses/spikiness.hpp"

#include "attnscope/attention.hpp"

#include <cmath>
#include <limits>

namespace attnscope::analyses {

MalaTerms mala_terms(const VecD& phi_q, const MatD& phi_k) {
  MalaTerms t;
  t.scores = phi_k * phi_q;
  const double s = t.scores.sum();
  t.beta = 1.0 + 1.0 / s;
  t.gamma = s / static_cast<double>(phi_k.rows());
  return t;
}

HeadSweeper::HeadSweeper(const Variant& v, const MatD& k, double scale, SpikinessOptions opts)
    : variant_(v), compute_(v), keys_(k), scale_(scale), opts_(std::move(opts)),
      space_(effective_space(v, opts_.space)) {
  if (v.family == Family::Softmax) return;
  variant_.map.ensure_params(static_cast<int>(k.cols()));
  homogeneous_map_ = positively_homogeneous(variant_.map);
  const MatD phi_k = variant_.map.apply<double>(k);
  phi_factor_ = variant_.phi_factor(scale, static_cast<int>(k.rows()));
  phi_keys_ = phi_factor_ * phi_k;
  if (space_ == ScaleSpace::Feature) {
    // The library computes the family on phi(q) and phi(K) as plain inputs: the same variant with
    // the identity map (the convention's factor is still applied by the library).
    compute_.map = FeatureMap{};
    keys_ = phi_k;
  }
}

MatD HeadSweeper::rows(const MatD& inputs) const {
  return attention_weights<double>(compute_, inputs, keys_, scale_);
}

std::vector<LawResult> HeadSweeper::laws() const {
  std::vector<Law> which;
  switch (variant_.family) {
    case Family::Softmax: which = {Law::SoftmaxPower}; break;
    case Family::Linear: which = {Law::LinearInvariant}; break;
    case Family::InLine: which = {Law::InlineAffine}; break;
    case Family::Mala: which = {Law::MalaRatio, Law::MalaBetaGamma}; break;
  }
  std::vector<LawResult> out;
  for (Law law : which) {
    LawResult r;
    r.variant = variant_.name();
    r.law = law;
    r.threshold = kLawTolerance;
    if (variant_.family != Family::Softmax && space_ == ScaleSpace::Query && !homogeneous_map_) {
      r.applicable = false;
      r.why = "query-space scaling with a map that is not positively homogeneous (" +
              variant_.map.name() + "): phi(a q) != a phi(q)";
    }
    out.push_back(std::move(r));
  }
  return out;
}

QuerySweep HeadSweeper::sweep(const VecD& q, bool keep_weights,
                              std::vector<LawResult>* laws) const {
  VecD q_in = q;
  if (variant_.family != Family::Softmax && space_ == ScaleSpace::Feature) {
    q_in = variant_.map.apply<double>(MatD(q.transpose())).row(0).transpose();
  }
  const auto n_scales = static_cast<Eigen::Index>(opts_.scales.size());
  // Row 0 is a = 1 (the reference keys are chosen there); row 1 + s is scale s.
  MatD inputs(n_scales + 1, q_in.size());
  inputs.row(0) = q_in.transpose();
  for (Eigen::Index s = 0; s < n_scales; ++s) {
    inputs.row(s + 1) = opts_.scales[static_cast<std::size_t>(s)] * q_in.transpose();
  }
  const MatD w = rows(inputs);
  const VecD w1 = w.row(0).transpose();

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
  if (laws != nullptr) check_laws(q_in, w, w1, out.key_high, out.key_low, *laws);
  return out;
}

namespace {

// NaN must never hide inside a std::max: a deviation that is not a number is infinitely large.
double finite_or_inf(double x) {
  return std::isnan(x) ? std::numeric_limits<double>::infinity() : x;
}

void record(LawResult& r, double deviation) {
  r.max_deviation = std::max(r.max_deviation, finite_or_inf(deviation));
  ++r.points;
}

bool near_pole(const VecD& w, int lo) {
  return !(std::abs(w[lo]) > kPoleGuard * w.cwiseAbs().maxCoeff());
}

}  // namespace

void HeadSweeper::check_laws(const VecD& q_in, const MatD& w, const VecD& w1, int hi, int lo,
                             std::vector<LawResult>& laws) const {
  const double n = static_cast<double>(w.cols());
  const double r1 = w1[hi] / w1[lo];
  // MALA's terms at a = 1, on features carrying the convention's factor.
  MalaTerms t;
  VecD phi_q;
  if (variant_.family == Family::Mala) {
    phi_q = phi_factor_ * (space_ == ScaleSpace::Feature
                               ? q_in
                               : VecD(variant_.map.apply<double>(MatD(q_in.transpose()))
                                          .row(0)
                                          .transpose()));
    t = mala_terms(phi_q, phi_keys_);
  }
  for (LawResult& r : laws) {
    if (!r.applicable) continue;
    ++r.queries;
    for (std::size_t s = 0; s < opts_.scales.size(); ++s) {
      const double a = opts_.scales[s];
      const VecD ws = w.row(static_cast<Eigen::Index>(s) + 1).transpose();
      const double ra = ws[hi] / ws[lo];
      switch (r.law) {
        case Law::SoftmaxPower: {
          if (ws[lo] <= 0.0 || w1[lo] <= 0.0 || ws[hi] <= 0.0) {
            ++r.skipped;
            break;
          }
          const double lnp = std::log(w1[hi]) - std::log(w1[lo]);
          const double lnr = std::log(ws[hi]) - std::log(ws[lo]);
          record(r, std::abs(lnr - a * lnp) / std::max(1.0, std::abs(a * lnp)));
          break;
        }
        case Law::LinearInvariant:
          if (near_pole(ws, lo) || near_pole(w1, lo)) {
            ++r.skipped;
            break;
          }
          record(r, std::abs(ra / r1 - 1.0));
          break;
        case Law::InlineAffine: {
          const VecD predicted = (1.0 / n) * VecD::Ones(ws.size()) + a * (w1.array() - 1.0 / n).matrix();
          const double denom = std::max(ws.cwiseAbs().maxCoeff(), 1.0 / n);
          record(r, (ws - predicted).cwiseAbs().maxCoeff() / denom);
          break;
        }
        case Law::MalaRatio: {
          const double x = a * t.beta / (t.beta + a - 1.0);
          const double pm = (t.beta * t.scores[hi] - x * t.gamma) /
                            (t.beta * t.scores[lo] - x * t.gamma);
          if (near_pole(ws, lo) || !std::isfinite(pm)) {
            ++r.skipped;
            break;
          }
          record(r, std::abs(ra - pm) / std::max(1.0, std::abs(pm)));
          break;
        }
        case Law::MalaBetaGamma: {
          const MalaTerms ta = mala_terms(VecD(a * phi_q), phi_keys_);
          const double beta_pred = (t.beta + a - 1.0) / a;
          const double gamma_pred = a * t.gamma;
          if (!std::isfinite(ta.beta) || ta.gamma == 0.0) {
            ++r.skipped;
            break;
          }
          record(r, std::max(std::abs(ta.beta - beta_pred) / std::abs(ta.beta),
                             std::abs(ta.gamma - gamma_pred) / std::abs(ta.gamma)));
          break;
        }
      }
    }
  }
}

}  // namespace attnscope::analyses
