// Attention entropy (entropy.hpp): softmax heads from float exponentials and one log per row
// (float_softmax_rows.hpp), others from the registry's weights in double, then one pass per row
// with portable::log.
#include "attnscope/analyses/entropy.hpp"

#include "attnscope/analyses/geometry_heads.hpp"

#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"
#include "attnscope/portable_math.hpp"
#include "float_softmax_rows.hpp"

#include <cmath>
#include <limits>

namespace attnscope::analyses {

namespace {

void check_options(const EntropyOptions& opt) {
  if (!(opt.log_eps >= 0.0) || !std::isfinite(opt.log_eps)) {
    throw UsageError("--log-eps: expected a finite number >= 0, found " +
                     std::to_string(opt.log_eps));
  }
}

/// -sum p log(p + eps) of one row of n weights: p = w as given, or |w| / sum |w| when a weight is
/// negative (`negative` then set). Zero weights contribute nothing (0 log 0 = 0).
double row_entropy(const double* w, Eigen::Index n, double eps, bool& negative,
                   double& negative_mass) {
  double abs_sum = 0.0;
  negative = false;
  negative_mass = 0.0;
  for (Eigen::Index j = 0; j < n; ++j) {
    if (w[j] < 0.0) {
      negative = true;
      negative_mass -= w[j];
    }
    abs_sum += std::abs(w[j]);
  }
  double h = 0.0;
  for (Eigen::Index j = 0; j < n; ++j) {
    const double p = negative ? std::abs(w[j]) / abs_sum : w[j];
    if (p != 0.0) h -= p * portable::log(p + eps);
  }
  return h;
}

/// Softmax rows from float exponentials e = exp(y): H = log Z - sum e y / Z, no log per weight.
EntropyRows float_entropy(const detail::FloatSoftmaxRows& ws) {
  const Eigen::Index n = ws.e.rows(), keys = ws.e.cols();
  EntropyRows out;
  out.entropy.resize(static_cast<std::size_t>(n));
  out.negative_mass.assign(static_cast<std::size_t>(n), 0.0);
  // sum_t e_t y_t per row in double, lane_sum's order (several rows at once).
  portable::dots_widened(ws.e.data(), ws.e.outerStride(), ws.y.data(), ws.y.outerStride(), n, keys,
                         out.entropy.data());
  for (Eigen::Index i = 0; i < n; ++i) {
    const double ey = out.entropy[static_cast<std::size_t>(i)];
    const double z = ws.sum[static_cast<std::size_t>(i)];
    out.entropy[static_cast<std::size_t>(i)] = portable::log(z) - ey / z;
  }
  return out;
}

/// H_i / log n_i per row, n_i the keys row i sees (its kept keys under `mask`, else `keys`).
std::vector<double> normalised_rows(const std::vector<double>& h, const Mask* mask,
                                    Eigen::Index keys) {
  std::vector<double> out(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) {
    const Eigen::Index n = mask != nullptr ? mask->row(static_cast<Eigen::Index>(i)).count() : keys;
    const double log_n = max_entropy(static_cast<int>(n));
    out[i] = std::isnan(h[i]) ? h[i] : (log_n > 0.0 ? h[i] / log_n : 0.0);
  }
  return out;
}

}  // namespace

double max_entropy(int tokens) {
  return tokens > 1 ? portable::log(static_cast<double>(tokens)) : 0.0;
}

EntropyRows attention_entropy(const Variant& v, const MatF& q, const MatF& k, double scale,
                              const EntropyOptions& opt, const Mask* mask) {
  check_options(opt);
  if (mask == nullptr && opt.log_eps == 0.0 && detail::takes_float_softmax(v)) {
    detail::FloatSoftmaxRows& ws = detail::thread_float_softmax_rows();
    if (detail::float_softmax_rows(q, k, scale, 0, true, ws)) {
      EntropyRows out = float_entropy(ws);
      out.normalised = normalised_rows(out.entropy, nullptr, k.rows());
      return out;
    }
  }
  Diagnostics diag;
  const MatD qd = q.cast<double>(), kd = k.cast<double>();
  const MatD w = attention_weights<double>(v, qd, kd, scale, mask, &diag);
  const auto n = static_cast<std::size_t>(w.rows());
  EntropyRows out;
  out.entropy.assign(n, std::numeric_limits<double>::quiet_NaN());
  out.negative_mass = out.entropy;
  std::size_t next = 0;  // diag.degenerate_rows is sorted
  for (Eigen::Index i = 0; i < w.rows(); ++i) {
    if (next < diag.degenerate_rows.size() && diag.degenerate_rows[next] == i) {
      ++next;
      ++out.degenerate;
      continue;
    }
    bool negative = false;
    const auto ui = static_cast<std::size_t>(i);
    out.entropy[ui] =
        row_entropy(w.row(i).data(), w.cols(), opt.log_eps, negative, out.negative_mass[ui]);
    out.negative_rows += negative ? 1 : 0;
  }
  out.normalised = normalised_rows(out.entropy, mask, k.rows());
  return out;
}

EntropyRows attention_entropy_units(const Variant& v, const MatF& q, const MatF& k, double scale,
                                    const LayerGeometry& geo, const EntropyOptions& opt) {
  check_unit_head("entropy", q, k, geo);
  const int nq = geo.unit_queries(), nk = geo.unit_keys();
  EntropyRows out;
  const auto append = [](std::vector<double>& to, const std::vector<double>& from) {
    to.insert(to.end(), from.begin(), from.end());
  };
  for (int u = 0; u < geo.units(); ++u) {
    const MatF qu = q.middleRows(static_cast<Eigen::Index>(u) * nq, nq);
    const MatF ku = k.middleRows(static_cast<Eigen::Index>(u) * nk, nk);
    const Mask mask = geo.unit_mask(u);
    const EntropyRows r = attention_entropy(v, qu, ku, scale, opt, geo.masked(u) ? &mask : nullptr);
    append(out.entropy, r.entropy);
    append(out.negative_mass, r.negative_mass);
    append(out.normalised, r.normalised);
    out.degenerate += r.degenerate;
    out.negative_rows += r.negative_rows;
  }
  return out;
}

QueryStatsLayout entropy_layout(int tokens, int bins) {
  if (bins < 1) throw UsageError("--bins must be at least 1, found " + std::to_string(bins));
  QueryStatsLayout layout;
  layout.quantities = {"entropy", "negative_mass", "normalised"};
  layout.counters = {"degenerate_rows", "negative_weight_rows"};
  layout.bins = HistogramBins{0.0, max_entropy(tokens), bins};
  return layout;
}

HeadMeasureFn entropy_measure(const EntropyOptions& opt, double scale, bool reference) {
  check_options(opt);
  return [opt, scale, reference](const Variant& v, const HeadView& h) {
    const double s = head_scale(h, scale);
    EntropyRows rows = h.geometry != nullptr && !h.geometry->square()
                           ? attention_entropy_units(v, h.q, h.k, s, *h.geometry, opt)
                       : reference ? attention_entropy_reference(v, h.q, h.k, s, opt)
                                   : attention_entropy(v, h.q, h.k, s, opt);
    HeadQueryValues out;
    out.values = {std::move(rows.entropy), std::move(rows.negative_mass),
                  std::move(rows.normalised)};
    out.counters = {rows.degenerate, rows.negative_rows};
    return out;
  };
}

}  // namespace attnscope::analyses
