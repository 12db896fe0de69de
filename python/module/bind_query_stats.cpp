// The per-query diagnostics of the command line (entropy, distance, rank: query_stats.hpp's
// analyses) on arrays: each head's values per query, and their totals per head over the images,
// folded as the commands fold a dump's layer (fold_head per image, QueryStatsTotals over images
// in order). Also the spikiness of single rows (spikiness.hpp's row_stats).
#include "arrays.hpp"
#include "bindings.hpp"

#include "attnscope/analyses/distance.hpp"
#include "attnscope/analyses/entropy.hpp"
#include "attnscope/analyses/head_error.hpp"
#include "attnscope/analyses/query_stats.hpp"
#include "attnscope/analyses/rank.hpp"
#include "attnscope/analyses/spikiness.hpp"
#include "attnscope/error.hpp"

#include <cmath>
#include <limits>
#include <optional>

namespace attnscope::python {

namespace {

using analyses::HeadQueryValues;
using analyses::HeadView;

using Measure = QueryMeasure;

}  // namespace

QueryMeasure query_measure(const std::string& name, const pyb::dict& options, Eigen::Index tokens,
                   double scale, bool reference) {
  const std::vector<std::string> known =
      name == "entropy"    ? std::vector<std::string>{"log_eps", "bins"}
      : name == "distance" ? std::vector<std::string>{"grid", "patch_size", "renormalise", "bins"}
      : name == "rank"     ? std::vector<std::string>{"rank_tol"}
                           : std::vector<std::string>{};
  if (known.empty()) {
    throw UsageError("analysis: expected entropy, distance or rank, got '" + name + "'");
  }
  require_known_options(name, options, known);
  const int bins = option(options, "bins", 32);
  if (bins < 1 || bins > 1000000) {
    throw UsageError("bins: expected 1 to 1000000 bins, found " + std::to_string(bins));
  }
  Measure m;
  if (name == "entropy") {
    analyses::EntropyOptions opt;
    opt.log_eps = option(options, "log_eps", 0.0);
    m.layout = analyses::entropy_layout(static_cast<int>(tokens), bins);
    m.fn = analyses::entropy_measure(opt, scale, reference);
  } else if (name == "distance") {
    if (!options.contains("grid"))
      throw UsageError("distance: the grid (prefix, height, width) is needed");
    const TokenGrid grid = grid_of(options["grid"].cast<std::vector<int>>(), tokens);
    const double patch = option(options, "patch_size", 1.0);
    const analyses::PatchGeometry geometry(grid, patch, patch);
    analyses::DistanceOptions opt;
    opt.renormalise = option(options, "renormalise", false);
    m.layout = analyses::distance_layout(geometry, bins);
    m.fn = analyses::distance_measure(geometry, opt, scale, reference);
  } else {
    analyses::RankOptions opt;
    opt.rank_tol = option(options, "rank_tol", 0.0);
    m.layout = analyses::rank_layout(static_cast<int>(tokens));
    m.fn = analyses::rank_measure(opt, scale, reference);
    m.need_v = true;
  }
  return m;
}

namespace {

/// The values v where the analysis needs them (UsageError when they are missing).
std::optional<Heads<float>> values_of(const Measure& m, pyb::handle v_obj, const Heads<float>& q) {
  if (!m.need_v) return std::nullopt;
  if (v_obj.is_none()) throw UsageError("this analysis needs v, the values");
  std::optional<Heads<float>> values(std::in_place, v_obj, "v");
  require_same_heads(q, *values, false);
  return values;
}

/// The model's own attention output where given (rank's collapse residual reads it; the other
/// analyses do not take it).
std::optional<Heads<float>> outputs_of(const std::string& name, pyb::handle out_obj,
                                       const Heads<float>& q) {
  if (out_obj.is_none()) return std::nullopt;
  if (name != "rank") throw UsageError(name + ": takes no out (only rank reads the model's output)");
  std::optional<Heads<float>> out(std::in_place, out_obj, "out");
  require_same_heads(q, *out, false);
  return out;
}

/// Measures every head of the stack in float; `values` and `outputs` may be null.
std::vector<HeadQueryValues> measure_heads(const Measure& m, const Variant& v,
                                           const Heads<float>& q, const Heads<float>& k,
                                           const Heads<float>* values,
                                           const Heads<float>* outputs) {
  std::vector<HeadQueryValues> out(static_cast<std::size_t>(q.count()));
  for_each_index(q.count(), [&](Eigen::Index i) {
    const MatF qi = q.head(i), ki = k.head(i);
    const MatF vi = values ? MatF(values->head(i)) : MatF();
    const MatF oi = outputs ? MatF(outputs->head(i)) : MatF();
    const int image = q.single() ? -1 : static_cast<int>(i / q.heads());
    const HeadView hv{image, 0, static_cast<int>(i % q.heads()), qi, ki, vi, &qi, nullptr,
                      outputs ? &oi : nullptr};
    out[static_cast<std::size_t>(i)] =
        analyses::in_head(image, 0, hv.head, [&] { return m.fn(v, hv); });
  });
  return out;
}

/// One analysis over one stack of heads: the inputs read, the measure and every head's values.
struct Measured {
  Heads<float> q;
  Measure m;
  std::vector<HeadQueryValues> heads;

  Measured(const std::string& name, pyb::handle q_obj, pyb::handle k_obj, pyb::handle v_obj,
           pyb::handle out_obj, const Variant& v, const pyb::object& scale_obj,
           const pyb::dict& options, bool reference)
      : q(q_obj, "q") {
    const Heads<float> k(k_obj, "k");
    require_same_heads(q, k, true);
    m = query_measure(name, options, q.tokens(), scale_or_default(scale_obj, q.dim()), reference);
    const std::optional<Heads<float>> values = values_of(m, v_obj, q);
    const std::optional<Heads<float>> outputs = outputs_of(name, out_obj, q);
    heads = measure_heads(m, v, q, k, values ? &*values : nullptr, outputs ? &*outputs : nullptr);
  }
};

/// Per query: each quantity's values [images, heads, n] (n = tokens, or 1 for a per-head
/// quantity) and each counter [images, heads]; a single head drops the first two axes.
pyb::dict per_query(const std::string& name, pyb::handle q_obj, pyb::handle k_obj,
                    pyb::handle v_obj, const std::string& spec, const pyb::object& scale_obj,
                    const pyb::dict& options, bool reference, const std::string& convention,
                    pyb::handle out_obj) {
  const Measured r(name, q_obj, k_obj, v_obj, out_obj, variant_of(spec, convention), scale_obj,
                   options, reference);
  pyb::dict d;
  for (std::size_t qi = 0; qi < r.m.layout.quantities.size(); ++qi) {
    const auto n = static_cast<pyb::ssize_t>(r.heads.front().values[qi].size());
    pyb::array_t<double> a(r.q.shape({n}));
    double* dst = a.mutable_data();
    for (const auto& h : r.heads) dst = std::copy(h.values[qi].begin(), h.values[qi].end(), dst);
    d[pyb::str(r.m.layout.quantities[qi])] = a;
  }
  for (std::size_t c = 0; c < r.m.layout.counters.size(); ++c) {
    if (r.q.single()) {
      d[pyb::str(r.m.layout.counters[c])] = r.heads.front().counters[c];
      continue;
    }
    pyb::array_t<std::int64_t> a(r.q.shape({}));
    std::int64_t* dst = a.mutable_data();
    for (const auto& h : r.heads) *dst++ = h.counters[c];
    d[pyb::str(r.m.layout.counters[c])] = a;
  }
  return d;
}

/// Totals per head over the images, as the commands total one layer of a dump: per quantity the
/// statistics of every (image, query) value and of the images' means; the histogram of quantity
/// 0 and the counters.
pyb::dict totals(const std::string& name, pyb::handle q_obj, pyb::handle k_obj, pyb::handle v_obj,
                 const std::string& spec, const pyb::object& scale_obj, const pyb::dict& options,
                 bool reference, const std::string& convention, pyb::handle out_obj) {
  const Variant v = variant_of(spec, convention);
  const Measured r(name, q_obj, k_obj, v_obj, out_obj, v, scale_obj, options, reference);
  const Heads<float>* q = &r.q;
  const Measure& m = r.m;
  const std::vector<HeadQueryValues>& heads = r.heads;
  const analyses::Selection sel = one_layer(q->heads());
  analyses::QueryStatsTotals sum({v}, sel, m.layout);
  const auto empty = analyses::labelled_cells(1, sel, m.layout);
  for (Eigen::Index image = 0; image < q->images(); ++image) {
    analyses::QueryStatsImage img;
    img.image = static_cast<int>(image);
    img.cells = empty;
    for (Eigen::Index h = 0; h < q->heads(); ++h) {
      analyses::fold_head(m.layout, heads[static_cast<std::size_t>(image * q->heads() + h)],
                          img.cells[0][static_cast<std::size_t>(h)]);
    }
    sum.add(img);
  }
  auto stats = [](const analyses::RunningStats& s) {
    // No value measured: NaN statistics, never a 0 or an infinity that reads as a value.
    const double nan = std::numeric_limits<double>::quiet_NaN();
    pyb::dict d;
    d["count"] = s.count;
    d["mean"] = s.count > 0 ? s.mean : nan;
    d["std"] = s.count > 0 ? s.stddev() : nan;
    d["min"] = s.count > 0 ? s.min : nan;
    d["max"] = s.count > 0 ? s.max : nan;
    return d;
  };
  pyb::list per_head;
  for (const auto& c : sum.result().cells[0]) {
    pyb::dict h;
    h["head"] = c.head;
    for (std::size_t qi = 0; qi < m.layout.quantities.size(); ++qi) {
      h[pyb::str(m.layout.quantities[qi])] = stats(c.queries[qi]);
      h[pyb::str(m.layout.quantities[qi] + "_images")] = stats(c.images[qi]);
    }
    for (std::size_t ci = 0; ci < m.layout.counters.size(); ++ci) {
      h[pyb::str(m.layout.counters[ci])] = c.counters[ci];
    }
    h["histogram"] = c.histogram;
    per_head.append(h);
  }
  pyb::list edges;
  for (int b = 0; b <= m.layout.bins.bins; ++b) edges.append(m.layout.bins.edge(b));
  pyb::dict d;
  d["heads"] = per_head;
  d["images"] = sum.result().images;
  d["bin_edges"] = edges;
  return d;
}

pyb::dict row_stats(pyb::handle w_obj, int topk) {
  if (const auto given = pyb::array::ensure(w_obj); given && given.dtype().kind() != 'f') {
    throw pyb::type_error("w: expected float16, float32 or float64 weights, got " +
                          std::string(pyb::str(given.dtype())));
  }
  const auto w = pyb::array_t<double, pyb::array::c_style | pyb::array::forcecast>::ensure(w_obj);
  if (!w || w.ndim() != 1 || w.size() == 0) {
    throw pyb::type_error("w: expected a non-empty 1-D array of weights (one attention row)");
  }
  if (topk < 1) throw UsageError("topk: expected a positive count, got " + std::to_string(topk));
  for (pyb::ssize_t j = 0; j < w.size(); ++j) {
    if (!std::isfinite(w.data()[j])) {
      throw InputError(
          "", "w", "finite values",
          std::string(std::isnan(w.data()[j]) ? "NaN" : "Inf") + " at key " + std::to_string(j));
    }
  }
  const analyses::RowStats s = analyses::row_stats(
      Eigen::Map<const VecD>(w.data(), static_cast<Eigen::Index>(w.size())), topk);
  pyb::dict d;
  d["max_weight"] = s.max_weight;
  d["entropy"] = s.entropy;
  d["effective_keys"] = s.effective_keys;
  d["topk_mass"] = s.topk_mass;
  d["negatives"] = s.negatives;
  d["zeros"] = s.zeros;
  return d;
}

/// One query's sweep over query magnitudes (spikiness.hpp's HeadSweeper, as `attnscope spikiness`
/// sweeps a sampled query): the reference keys, one point per scale, and the laws checked.
pyb::dict sweep(pyb::handle q_obj, pyb::handle k_obj, const std::string& spec, int token,
                const std::string& scales, const std::string& keys, int topk,
                const std::string& space, const pyb::object& scale_obj, bool keep_weights,
                const std::string& convention) {
  const Variant v = variant_of(spec, convention);
  const Heads<float> q(q_obj, "q"), k(k_obj, "k");
  require_same_heads(q, k, true);
  if (!q.single()) throw UsageError("sweep: expected one head, q and k of shape [tokens, dim]");
  if (token < 0 || token >= q.tokens()) {
    throw UsageError("token: expected a token index in [0, " + std::to_string(q.tokens()) +
                     "), got " + std::to_string(token));
  }
  if (topk < 1) throw UsageError("topk: expected a positive count, got " + std::to_string(topk));
  analyses::SpikinessOptions opt;
  opt.scales = analyses::parse_scales(scales);
  opt.keys = analyses::parse_key_pair(keys);
  opt.topk = topk;
  opt.space = analyses::parse_scale_space(space);
  const double s = scale_or_default(scale_obj, q.dim());
  analyses::QuerySweep result;
  std::vector<analyses::LawResult> laws;
  for_each_index(1, [&](Eigen::Index) {
    const MatD keys_d = k.head(0).cast<double>();
    const VecD query = q.head(0).row(token).cast<double>().transpose();
    const analyses::HeadSweeper sweeper(v, keys_d, s, opt);
    laws = sweeper.laws();
    result = sweeper.sweep(query, token, keep_weights, &laws);
  });
  pyb::list points;
  for (const auto& p : result.points) {
    pyb::dict d;
    d["scale"] = p.scale;
    d["ratio"] = p.ratio;
    d["max_weight"] = p.stats.max_weight;
    d["entropy"] = p.stats.entropy;
    d["effective_keys"] = p.stats.effective_keys;
    d["topk_mass"] = p.stats.topk_mass;
    d["negatives"] = p.stats.negatives;
    d["zeros"] = p.stats.zeros;
    points.append(d);
  }
  pyb::list law_list;
  for (const auto& l : laws) {
    pyb::dict d;
    d["law"] = analyses::to_string(l.law);
    d["max_deviation"] = l.max_deviation;
    d["points"] = l.points;
    d["skipped"] = l.skipped;
    d["applicable"] = l.applicable;
    d["why"] = l.why;
    d["threshold"] = l.threshold;
    d["pass"] = l.pass();
    law_list.append(d);
  }
  pyb::dict d;
  d["key_high"] = result.key_high;
  d["key_low"] = result.key_low;
  d["points"] = points;
  d["laws"] = law_list;
  if (keep_weights) {
    const auto n = static_cast<pyb::ssize_t>(q.tokens());
    pyb::array_t<double> w({static_cast<pyb::ssize_t>(result.weights.size()), n});
    double* dst = w.mutable_data();
    for (const VecD& row : result.weights)
      dst = std::copy(row.data(), row.data() + row.size(), dst);
    d["weights"] = w;
  }
  return d;
}

}  // namespace

void bind_query_stats(pyb::module_& m) {
  m.def("sweep", &sweep, pyb::arg("q"), pyb::arg("k"), pyb::arg("variant"), pyb::arg("token"),
        pyb::arg("scales"), pyb::arg("keys"), pyb::arg("topk"), pyb::arg("space"),
        pyb::arg("scale"), pyb::arg("keep_weights"), pyb::arg("convention"));
  m.def("per_query", &per_query, pyb::arg("analysis"), pyb::arg("q"), pyb::arg("k"), pyb::arg("v"),
        pyb::arg("variant"), pyb::arg("scale"), pyb::arg("options"), pyb::arg("reference"),
        pyb::arg("convention"), pyb::arg("out") = pyb::none());
  m.def("totals", &totals, pyb::arg("analysis"), pyb::arg("q"), pyb::arg("k"), pyb::arg("v"),
        pyb::arg("variant"), pyb::arg("scale"), pyb::arg("options"), pyb::arg("reference"),
        pyb::arg("convention"), pyb::arg("out") = pyb::none());
  m.def("row_stats", &row_stats, pyb::arg("w"), pyb::arg("topk"));
}

}  // namespace attnscope::python
