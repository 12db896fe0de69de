// The analyses on arrays: confusion counts and pairs, local mass, maps and the census, per head
// and totalled over images the way the command line totals a dump (the same library calls, images
// folded in order), so that a stack of heads [images, heads, tokens, dim] read from a dump's
// layer gives the numbers of that layer's rows in the command's CSV files.
//
// The analyses work in the dump's precision: float16 and float32 heads are read as float32,
// float64 heads are rounded to float32 (their weights are then computed in double, as for a dump).
#include "arrays.hpp"
#include "bindings.hpp"
#include "live.hpp"

#include "attnscope/analyses/census.hpp"
#include "attnscope/analyses/confusion.hpp"
#include "attnscope/analyses/head_error.hpp"
#include "attnscope/analyses/locality.hpp"
#include "attnscope/analyses/maps.hpp"
#include "attnscope/error.hpp"

#include <limits>

namespace attnscope::python {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

using analyses::HeadView;
using analyses::Selection;

/// The values as an array of `shape`, or the one value where the input was a single head.
template <typename V>
pyb::object array_or_value(bool single, const std::vector<pyb::ssize_t>& shape,
                           const std::vector<V>& values) {
  if (single) return pyb::cast(values.front());
  pyb::array_t<V> out(shape);
  std::copy(values.begin(), values.end(), out.mutable_data());
  return out;
}

/// One value per (image, head): [images, heads].
template <typename V>
pyb::object per_head(const Heads<float>& q, const std::vector<V>& values) {
  return array_or_value(q.single(), q.shape({}), values);
}

/// One total per head over the images: [heads].
template <typename V>
pyb::object per_head_total(const Heads<float>& q, const std::vector<V>& values) {
  return array_or_value(q.single(), {static_cast<pyb::ssize_t>(q.heads())}, values);
}

/// Per (image, head) arrays [images, heads, tail...] of doubles; a single head drops the first two.
pyb::array_t<double> per_head_rows(const Heads<float>& q,
                                   const std::vector<std::vector<double>>& rows,
                                   std::vector<pyb::ssize_t> tail) {
  pyb::array_t<double> out(q.shape(tail));
  double* dst = out.mutable_data();
  for (const auto& r : rows) dst = std::copy(r.begin(), r.end(), dst);
  return out;
}

/// The head's q and k as the MatFs the analyses take, copied into buffers of the calling thread
/// (kept between heads and calls: no allocation per head).
struct FloatHead {
  const MatF& q;
  const MatF& k;
  FloatHead(const Heads<float>& qs, const Heads<float>& ks, Eigen::Index i)
      : q(fill(0, qs, i)), k(fill(1, ks, i)) {}

 private:
  static const MatF& fill(int which, const Heads<float>& h, Eigen::Index i) {
    thread_local MatF buffers[2];
    MatF& b = buffers[which];
    b = h.head(i);
    return b;
  }
};

pyb::dict confusion(pyb::handle q_obj, pyb::handle k_obj, const std::string& spec, double eps,
                    double query_eps, const pyb::object& scale_obj, bool reference,
                    const std::string& convention) {
  const Variant v = variant_of(spec, convention);
  const Heads<float> q(q_obj, "q"), k(k_obj, "k");
  require_same_heads(q, k, true);
  const double scale = scale_or_default(scale_obj, q.dim());
  analyses::ConfusionOptions opt;
  opt.eps = eps;
  opt.query_eps = query_eps;
  analyses::check_confusion_options(opt);
  std::vector<analyses::HeadConfusion> out(static_cast<std::size_t>(q.count()));
  for_each_index(q.count(), [&](Eigen::Index i) {
    const FloatHead h(q, k, i);
    out[static_cast<std::size_t>(i)] = analyses::in_head(
        q.single() ? -1 : static_cast<int>(i / q.heads()), 0, static_cast<int>(i % q.heads()), [&] {
          return reference ? analyses::count_confusion_reference(v, h.q, h.q, h.k, scale, opt)
                           : analyses::count_confusion(v, h.q, h.q, h.k, scale, opt);
        });
  });
  std::vector<std::int64_t> pairs, dead_rows, dead_pairs, candidates;
  for (const auto& c : out) {
    pairs.push_back(c.pairs);
    dead_rows.push_back(c.degenerate_rows);
    dead_pairs.push_back(c.degenerate_pairs);
    candidates.push_back(c.candidates);
  }
  pyb::dict d;
  d["pairs"] = per_head(q, pairs);
  d["degenerate_rows"] = per_head(q, dead_rows);
  d["degenerate_pairs"] = per_head(q, dead_pairs);
  d["candidates"] = per_head(q, candidates);
  return d;
}

pyb::array_t<std::int64_t> confused_pairs(pyb::handle q_obj, pyb::handle k_obj,
                                          const std::string& spec, double eps, double query_eps,
                                          const pyb::object& scale_obj,
                                          const std::string& convention) {
  const Variant v = variant_of(spec, convention);
  const Heads<float> q(q_obj, "q"), k(k_obj, "k");
  require_same_heads(q, k, true);
  if (!q.single())
    throw UsageError("confused_pairs: expected one head, q and k of shape [tokens, dim]");
  const double scale = scale_or_default(scale_obj, q.dim());
  analyses::ConfusionOptions opt;
  opt.eps = eps;
  opt.query_eps = query_eps;
  analyses::check_confusion_options(opt);
  std::vector<std::pair<int, int>> pairs;
  for_each_index(1, [&](Eigen::Index) {
    const FloatHead h(q, k, 0);
    (void)analyses::count_confusion_reference(v, h.q, h.q, h.k, scale, opt, nullptr, &pairs);
  });
  pyb::array_t<std::int64_t> out({static_cast<pyb::ssize_t>(pairs.size()), pyb::ssize_t{2}});
  std::int64_t* dst = out.mutable_data();
  for (const auto& [i, j] : pairs) {
    *dst++ = i;
    *dst++ = j;
  }
  return out;
}

pyb::tuple local_mass(pyb::handle q_obj, pyb::handle k_obj, const std::string& spec,
                      const std::vector<int>& grid_spec, int window, const pyb::object& scale_obj,
                      const std::string& convention) {
  const Variant v = variant_of(spec, convention);
  const Heads<float> q(q_obj, "q"), k(k_obj, "k");
  require_same_heads(q, k, true);
  const TokenGrid grid = grid_of(grid_spec, q.tokens());
  const double scale = scale_or_default(scale_obj, q.dim());
  std::vector<std::vector<double>> mass(static_cast<std::size_t>(q.count()));
  std::vector<std::int64_t> dead(static_cast<std::size_t>(q.count()));
  for_each_index(q.count(), [&](Eigen::Index i) {
    // local_mass reads the heads in place (Eigen::Ref): no copy of the caller's buffer.
    int degenerate = 0;
    mass[static_cast<std::size_t>(i)] =
        analyses::local_mass(v, q.head(i), k.head(i), scale, grid, window, &degenerate);
    dead[static_cast<std::size_t>(i)] = degenerate;
  });
  return pyb::make_tuple(per_head_rows(q, mass, {q.tokens()}), per_head(q, dead));
}

/// One layer of heads as a live analysis sees it: the variant, layer 0, the stack's heads.
LiveSetup one_layer_setup(const Variant& v, const Heads<float>& q, const pyb::object& scale_obj,
                          const TokenGrid& grid) {
  return {{v}, {0}, static_cast<int>(q.heads()), scale_or_default(scale_obj, q.dim()), grid};
}

/// Local mass totalled per head over the images, as `attnscope locality` totals a layer.
pyb::dict locality(pyb::handle q_obj, pyb::handle k_obj, const std::string& spec,
                   const std::vector<int>& grid_spec, int window, const pyb::object& scale_obj,
                   const std::string& convention) {
  const Variant v = variant_of(spec, convention);
  const Heads<float> q(q_obj, "q"), k(k_obj, "k");
  require_same_heads(q, k, true);
  LiveLocality live(one_layer_setup(v, q, scale_obj, grid_of(grid_spec, q.tokens())), window);
  live.add(LiveBatch{{q}, {k}, {}, {}});
  const analyses::LocalityResult r = live.result();
  std::vector<std::int64_t> count, dead;
  std::vector<double> mean, stddev, min, max;
  for (const auto& h : r.per_head[0]) {
    // A head without a measured query has no statistics: NaN, never a 0 or an infinity that
    // reads as a value.
    const auto measured = [&h](double x) { return h.mass.count > 0 ? x : kNaN; };
    count.push_back(h.mass.count);
    mean.push_back(measured(h.mass.mean));
    stddev.push_back(measured(h.mass.stddev()));
    min.push_back(measured(h.mass.min));
    max.push_back(measured(h.mass.max));
    dead.push_back(h.degenerate_rows);
  }
  pyb::dict d;
  d["queries"] = per_head_total(q, count);
  d["mean"] = per_head_total(q, mean);
  d["std"] = per_head_total(q, stddev);
  d["min"] = per_head_total(q, min);
  d["max"] = per_head_total(q, max);
  d["degenerate_rows"] = per_head_total(q, dead);
  d["images"] = r.images;
  d["uniform_baseline"] = r.uniform_baseline;
  return d;
}

/// The weight census per head over the images, as `attnscope census` counts a layer.
pyb::dict census(pyb::handle q_obj, pyb::handle k_obj, const std::string& spec,
                 double sum_tolerance, const pyb::object& scale_obj,
                 const std::string& convention) {
  const Variant v = variant_of(spec, convention);
  const Heads<float> q(q_obj, "q"), k(k_obj, "k");
  require_same_heads(q, k, true);
  // The census uses no grid: any grid holding the tokens will do.
  const TokenGrid grid{0, 1, static_cast<int>(q.tokens())};
  LiveCensus live(one_layer_setup(v, q, scale_obj, grid), sum_tolerance);
  live.add(LiveBatch{{q}, {k}, {}, {}});
  const analyses::CensusColumns c = analyses::census_columns(live.cells());
  pyb::dict d;
  d["rows"] = per_head_total(q, c.rows);
  d["weights"] = per_head_total(q, c.weights);
  d["negative"] = per_head_total(q, c.negative);
  d["zero"] = per_head_total(q, c.zero);
  std::vector<double> most_negative = c.most_negative;  // NaN for a head without a weight
  for (std::size_t i = 0; i < most_negative.size(); ++i) {
    if (c.weights[i] == 0) most_negative[i] = kNaN;
  }
  d["most_negative"] = per_head_total(q, most_negative);
  d["rows_not_summing_to_one"] = per_head_total(q, c.rows_not_summing_to_one);
  d["max_row_sum_error"] = per_head_total(q, c.max_row_sum_error);
  d["degenerate_rows"] = per_head_total(q, c.degenerate_rows);
  return d;
}

/// The map of query `token` on the grid (and its prefix keys' weights) for every head.
pyb::tuple attention_map(pyb::handle q_obj, pyb::handle k_obj, const std::string& spec,
                         const std::vector<int>& grid_spec, int token, const pyb::object& scale_obj,
                         const std::string& convention) {
  const Variant v = variant_of(spec, convention);
  const Heads<float> q(q_obj, "q"), k(k_obj, "k");
  require_same_heads(q, k, true);
  const TokenGrid grid = grid_of(grid_spec, q.tokens());
  if (token < 0 || token >= grid.tokens()) {
    throw UsageError("token: expected a token index in [0, " + std::to_string(grid.tokens()) +
                     "), got " + std::to_string(token));
  }
  const double scale = scale_or_default(scale_obj, q.dim());
  std::vector<std::vector<double>> maps(static_cast<std::size_t>(q.count()));
  std::vector<std::vector<double>> prefix(static_cast<std::size_t>(q.count()));
  for_each_index(q.count(), [&](Eigen::Index i) {
    const FloatHead h(q, k, i);
    const analyses::ExactRows rows(v, h.q, h.k, scale);
    const analyses::AttentionMap m = analyses::attention_map(rows, grid, token);
    maps[static_cast<std::size_t>(i)].assign(m.grid.data(), m.grid.data() + m.grid.size());
    prefix[static_cast<std::size_t>(i)] = m.prefix;
  });
  return pyb::make_tuple(per_head_rows(q, maps, {grid.height, grid.width}),
                         per_head_rows(q, prefix, {grid.prefix}));
}

}  // namespace

Selection one_layer(Eigen::Index heads) {
  Selection s;
  s.layers = {0};
  for (int h = 0; h < heads; ++h) s.heads.push_back(h);
  return s;
}

void bind_analyses(pyb::module_& m) {
  m.def("confusion", &confusion, pyb::arg("q"), pyb::arg("k"), pyb::arg("variant"), pyb::arg("eps"),
        pyb::arg("query_eps"), pyb::arg("scale"), pyb::arg("reference"), pyb::arg("convention"));
  m.def("confused_pairs", &confused_pairs, pyb::arg("q"), pyb::arg("k"), pyb::arg("variant"),
        pyb::arg("eps"), pyb::arg("query_eps"), pyb::arg("scale"), pyb::arg("convention"));
  m.def("local_mass", &local_mass, pyb::arg("q"), pyb::arg("k"), pyb::arg("variant"),
        pyb::arg("grid"), pyb::arg("window"), pyb::arg("scale"), pyb::arg("convention"));
  m.def("locality", &locality, pyb::arg("q"), pyb::arg("k"), pyb::arg("variant"), pyb::arg("grid"),
        pyb::arg("window"), pyb::arg("scale"), pyb::arg("convention"));
  m.def("census", &census, pyb::arg("q"), pyb::arg("k"), pyb::arg("variant"), pyb::arg("sum_tol"),
        pyb::arg("scale"), pyb::arg("convention"));
  m.def("attention_map", &attention_map, pyb::arg("q"), pyb::arg("k"), pyb::arg("variant"),
        pyb::arg("grid"), pyb::arg("token"), pyb::arg("scale"), pyb::arg("convention"));
}

}  // namespace attnscope::python
