// Rank diagnostics (rank.hpp): singular values (singular_values.hpp: fixed-order
// bidiagonalisation, the same bits on every CPU) of the registry's weights, key features and
// key-value state.
#include "attnscope/analyses/rank.hpp"

#include "attnscope/analyses/geometry_heads.hpp"

#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"
#include "attnscope/portable_math.hpp"
#include "attnscope/singular_values.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace attnscope::analyses {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

}  // namespace

Spectrum spectrum_of(std::vector<double> sigma, Eigen::Index rows, Eigen::Index cols,
                     const RankOptions& opt) {
  std::sort(sigma.begin(), sigma.end(), std::greater<>());
  Spectrum s;
  if (sigma.empty() || !(sigma.front() > 0.0)) return s;
  const double top = sigma.front();
  const double tol = opt.rank_tol > 0.0 ? opt.rank_tol * top
                                        : top * static_cast<double>(std::max(rows, cols)) *
                                              std::numeric_limits<double>::epsilon();
  double total = 0.0;
  for (double x : sigma) {
    s.rank += x > tol ? 1 : 0;
    total += x;
  }
  double h = 0.0;
  for (double x : sigma) {
    const double p = x / total;
    if (p > 0.0) h -= p * portable::log(p);
  }
  s.erank = portable::exp(h);
  const auto m = static_cast<std::size_t>(std::min(rows, cols));
  s.ratio = m <= sigma.size() ? sigma[m - 1] / top : 0.0;
  s.full_column_rank = rows >= cols && s.rank == cols;
  return s;
}

double collapse_residual(const MatF& out) {
  const MatD o = out.cast<double>();
  const double norm = o.norm();
  if (!(norm > 0.0)) return kNaN;
  const Eigen::RowVectorXd mean = o.colwise().mean();
  return (o.rowwise() - mean).norm() / norm;
}

HeadRank head_rank(const Variant& v, const MatF& q, const MatF& k, const MatF& values,
                   const MatF* out, double scale, const RankOptions& opt, const Mask* mask) {
  Diagnostics diag;
  const MatD qd = q.cast<double>(), kd = k.cast<double>();
  const MatD w = attention_weights<double>(v, qd, kd, scale, mask, &diag);
  HeadRank r;
  r.degenerate = static_cast<int>(diag.degenerate_rows.size());
  r.w = spectrum_of(singular_values(w), w.rows(), w.cols(), opt);
  SingularPair keys = singular_values_with_ones(kd);
  r.k = spectrum_of(std::move(keys.x), kd.rows(), kd.cols(), opt);
  r.k1 = spectrum_of(std::move(keys.with_ones), kd.rows(), kd.cols() + 1, opt);
  if (v.kernel()) {  // key features and a key-value state: the kernel form's
    const KernelFeatures f = kernel_features(v, qd, kd, scale);
    SingularPair features = singular_values_with_ones(f.k);
    r.fk = spectrum_of(std::move(features.x), f.k.rows(), f.k.cols(), opt);
    r.fk1 = spectrum_of(std::move(features.with_ones), f.k.rows(), f.k.cols() + 1, opt);
    r.has_features = true;
    if (mask == nullptr) {  // under a mask each query sums its own keys: no one state
      const MatD vd = values.cast<double>();
      MatD state(f.k.cols(), vd.cols());
      portable::product(f.k.transpose(), vd, state);
      r.kv = spectrum_of(singular_values(state), state.rows(), state.cols(), opt);
      r.has_kv = true;
    }
  }
  r.out_residual = out != nullptr ? collapse_residual(*out) : kNaN;
  return r;
}

QueryStatsLayout rank_layout(int tokens) {
  QueryStatsLayout layout;
  layout.quantities = {"rank",     "erank",    "kv_rank",   "kv_erank",    "k_ratio",
                       "k1_ratio", "fk_ratio", "fk1_ratio", "out_residual"};
  layout.counters = {"degenerate_rows", "k_full_rank", "k1_full_rank", "fk_full_rank",
                     "fk1_full_rank"};
  layout.bins = HistogramBins{0.0, static_cast<double>(tokens) + 1.0, std::min(tokens + 1, 256)};
  return layout;
}

std::vector<HeadRank> head_rank_units(const Variant& v, const MatF& q, const MatF& k,
                                      const MatF& values, double scale, const LayerGeometry& geo,
                                      const RankOptions& opt) {
  check_unit_head("rank", q, k, geo);
  if (values.rows() != k.rows()) {
    throw UsageError("rank: a head of " + std::to_string(k.rows()) + " keys and " +
                     std::to_string(values.rows()) + " values is not of the layer's geometry (" +
                     geo.describe() + ")");
  }
  const int nq = geo.unit_queries(), nk = geo.unit_keys();
  std::vector<HeadRank> out;
  for (int u = 0; u < geo.units(); ++u) {
    const MatF qu = q.middleRows(static_cast<Eigen::Index>(u) * nq, nq);
    const MatF ku = k.middleRows(static_cast<Eigen::Index>(u) * nk, nk);
    const MatF vu = values.middleRows(static_cast<Eigen::Index>(u) * nk, nk);
    const Mask mask = geo.unit_mask(u);
    out.push_back(head_rank(v, qu, ku, vu, nullptr, scale, opt, geo.masked(u) ? &mask : nullptr));
  }
  return out;
}

HeadMeasureFn rank_measure(const RankOptions& opt, double scale, bool reference) {
  if (!(opt.rank_tol >= 0.0) || !std::isfinite(opt.rank_tol)) {
    throw UsageError("--rank-tol: expected a finite number >= 0, found " +
                     std::to_string(opt.rank_tol));
  }
  return [opt, scale, reference](const Variant& v, const HeadView& h) {
    const double s = head_scale(h, scale);
    std::vector<HeadRank> units;
    if (h.geometry != nullptr && !h.geometry->square()) {
      units = head_rank_units(v, h.q, h.k, h.v, s, *h.geometry, opt);
      units.front().out_residual = h.out != nullptr ? collapse_residual(*h.out) : kNaN;
    } else {
      units.push_back(reference ? head_rank_reference(v, h.q, h.k, h.v, h.out, s, opt)
                                : head_rank(v, h.q, h.k, h.v, h.out, s, opt));
    }
    HeadQueryValues out;
    out.values.assign(9, {});
    out.counters.assign(5, 0);
    for (const HeadRank& r : units) {
      const auto kv = [&](double x) { return r.has_kv ? x : kNaN; };
      const auto fk = [&](double x) { return r.has_features ? x : kNaN; };
      const double row[] = {static_cast<double>(r.w.rank),
                            r.w.erank,
                            kv(r.kv.rank),
                            kv(r.kv.erank),
                            r.k.ratio,
                            r.k1.ratio,
                            fk(r.fk.ratio),
                            fk(r.fk1.ratio),
                            r.out_residual};
      for (std::size_t q = 0; q < 9; ++q) out.values[q].push_back(row[q]);
      const std::int64_t counts[] = {r.degenerate, r.k.full_column_rank ? 1 : 0,
                                     r.k1.full_column_rank ? 1 : 0,
                                     r.has_features && r.fk.full_column_rank ? 1 : 0,
                                     r.has_features && r.fk1.full_column_rank ? 1 : 0};
      for (std::size_t c = 0; c < 5; ++c) out.counters[c] += counts[c];
    }
    return out;
  };
}

}  // namespace attnscope::analyses
