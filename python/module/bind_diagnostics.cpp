// The remaining diagnostics of the command line on arrays: attention sinks and high-norm tokens
// (`attnscope sinks`), attention rollout (`attnscope rollout`), layer-local masking (`attnscope
// mask`) and the propositions' checks (`attnscope verify`). Each head is computed by the library
// call the command makes for it (sinks.hpp, rollout.hpp, masking.hpp, propositions.hpp), so a
// layer of a dump read as [images, heads, tokens, dim] gives the numbers of that layer's rows.
#include "arrays.hpp"
#include "bindings.hpp"

#include "attnscope/analyses/head_error.hpp"
#include "attnscope/analyses/masking.hpp"
#include "attnscope/analyses/propositions.hpp"
#include "attnscope/analyses/rollout.hpp"
#include "attnscope/analyses/sinks.hpp"
#include "attnscope/error.hpp"

#include <cmath>
#include <limits>

namespace attnscope::python {

namespace {

int image_of(const Heads<float>& q, Eigen::Index i) {
  return q.single() ? -1 : static_cast<int>(i / q.heads());
}

/// Per (image, head) values as [images, heads] (one value for a single head).
template <typename V>
pyb::object per_head_array(const Heads<float>& q, const std::vector<V>& values) {
  if (q.single()) return pyb::cast(values.front());
  pyb::array_t<V> out(q.shape({}));
  std::copy(values.begin(), values.end(), out.mutable_data());
  return out;
}

/// Per head totals as [heads] (one value for a single head).
template <typename V>
pyb::object per_head_totals(const Heads<float>& q, const std::vector<V>& values) {
  if (q.single()) return pyb::cast(values.front());
  pyb::array_t<V> out(std::vector<pyb::ssize_t>{static_cast<pyb::ssize_t>(values.size())});
  std::copy(values.begin(), values.end(), out.mutable_data());
  return out;
}

pyb::dict sinks(pyb::handle q_obj, pyb::handle k_obj, const std::string& spec, double threshold,
                const pyb::object& scale_obj, bool reference, const std::string& convention) {
  const Variant v = variant_of(spec, convention);
  analyses::SinkOptions opt;
  opt.threshold = threshold;
  analyses::check_sink_options(opt);
  const Heads<float> q(q_obj, "q"), k(k_obj, "k");
  require_same_heads(q, k, true);
  const double scale = scale_or_default(scale_obj, q.dim());
  std::vector<analyses::HeadSinks> out(static_cast<std::size_t>(q.count()));
  for_each_index(q.count(), [&](Eigen::Index i) {
    const MatF qi = q.head(i), ki = k.head(i);
    out[static_cast<std::size_t>(i)] =
        analyses::in_head(image_of(q, i), 0, static_cast<int>(i % q.heads()), [&] {
          return reference ? analyses::head_sinks_reference(v, qi, ki, scale, threshold)
                           : analyses::head_sinks(v, qi, ki, scale, threshold);
        });
  });
  pyb::array_t<double> received(q.shape({q.tokens()}));
  double* dst = received.mutable_data();
  std::vector<std::int64_t> valid, dead;
  pyb::list keys;
  for (const auto& h : out) {
    dst = std::copy(h.received.begin(), h.received.end(), dst);
    valid.push_back(h.valid_rows);
    dead.push_back(h.degenerate);
    keys.append(pyb::cast(h.sink_keys));
  }
  pyb::dict d;
  d["received"] = received;
  d["valid_rows"] = per_head_array(q, valid);
  d["degenerate_rows"] = per_head_array(q, dead);
  if (q.single()) {
    d["sink_keys"] = keys[0];
  } else {  // [images][heads] lists of keys
    pyb::list per_image;
    for (Eigen::Index i = 0; i < q.images(); ++i) {
      pyb::list heads;
      for (Eigen::Index h = 0; h < q.heads(); ++h) heads.append(keys[i * q.heads() + h]);
      per_image.append(heads);
    }
    d["sink_keys"] = per_image;
  }
  return d;
}

/// Each token's norm over the heads of one layer, relative to the image's median, as the command
/// computes it: |x_{h,t}|^2 summed in double over the dimension, then over the heads in order.
pyb::dict token_norms(pyb::handle x_obj, double ratio) {
  analyses::SinkOptions opt;
  opt.norm_ratio = ratio;
  analyses::check_sink_options(opt);
  const Heads<float> x(x_obj, "x");
  const auto n = static_cast<std::size_t>(x.tokens());
  std::vector<analyses::LayerNorms> out(static_cast<std::size_t>(x.images()));
  for_each_index(x.images(), [&](Eigen::Index i) {
    std::vector<double> total(n, 0.0);
    for (Eigen::Index h = 0; h < x.heads(); ++h) {
      const auto head = x.head(i * x.heads() + h);
      for (Eigen::Index t = 0; t < head.rows(); ++t) {
        double a = 0.0;
        for (Eigen::Index c = 0; c < head.cols(); ++c)
          a += static_cast<double>(head(t, c)) * static_cast<double>(head(t, c));
        total[static_cast<std::size_t>(t)] += a;
      }
    }
    out[static_cast<std::size_t>(i)] = analyses::layer_norms(total, ratio);
  });
  const std::vector<pyb::ssize_t> shape =
      x.single() ? std::vector<pyb::ssize_t>{x.tokens()}
                 : std::vector<pyb::ssize_t>{x.images(), x.tokens()};
  pyb::array_t<double> ratios(shape);
  pyb::array_t<bool> high(shape);
  std::vector<double> medians;
  double* r = ratios.mutable_data();
  bool* hi = high.mutable_data();
  for (const auto& l : out) {
    r = std::copy(l.ratio.begin(), l.ratio.end(), r);
    for (char c : l.high) *hi++ = c != 0;
    medians.push_back(l.median);
  }
  pyb::dict d;
  d["ratio"] = ratios;
  d["high"] = high;
  if (x.single()) {
    d["median"] = medians.front();
  } else {
    pyb::array_t<double> m(std::vector<pyb::ssize_t>{x.images()});
    std::copy(medians.begin(), medians.end(), m.mutable_data());
    d["median"] = m;
  }
  return d;
}

pyb::dict rollout(const pyb::list& q_layers, const pyb::list& k_layers, const std::string& spec,
                  const std::string& fusion_name, const pyb::object& scale_obj, bool reference,
                  const std::string& convention) {
  const Variant v = variant_of(spec, convention);
  const analyses::HeadFusion fusion = analyses::parse_head_fusion(fusion_name);
  if (q_layers.empty() || q_layers.size() != k_layers.size()) {
    throw UsageError("rollout: expected lists of q and of k with one array per layer, of the same "
                     "length, got " + std::to_string(q_layers.size()) + " and " +
                     std::to_string(k_layers.size()));
  }
  std::vector<Heads<float>> q, k;
  for (pyb::handle a : q_layers) {
    q.emplace_back(a, "q");
    require_same_heads(q.front(), q.back(), true);
  }
  for (pyb::handle a : k_layers) {
    k.emplace_back(a, "k");
    require_same_heads(q.front(), k.back(), true);
  }
  const Heads<float>& q0 = q.front();
  const double scale = scale_or_default(scale_obj, q0.dim());
  std::vector<analyses::RolloutRow> out(static_cast<std::size_t>(q0.images()));
  for_each_index(q0.images(), [&](Eigen::Index i) {
    std::vector<std::vector<MatF>> qi(q.size()), ki(q.size());
    for (std::size_t l = 0; l < q.size(); ++l) {
      for (Eigen::Index h = 0; h < q0.heads(); ++h) {
        qi[l].emplace_back(q[l].head(i * q0.heads() + h));
        ki[l].emplace_back(k[l].head(i * q0.heads() + h));
      }
    }
    try {
      out[static_cast<std::size_t>(i)] =
          analyses::rollout_of_heads(v, qi, ki, scale, fusion, reference);
    } catch (const NumericalError& e) {
      if (q0.single()) throw;
      throw NumericalError("image " + std::to_string(i) + ": " + e.what());
    }
  });
  const std::vector<pyb::ssize_t> shape =
      q0.single() ? std::vector<pyb::ssize_t>{q0.tokens()}
                  : std::vector<pyb::ssize_t>{q0.images(), q0.tokens()};
  pyb::array_t<double> cls(shape);
  double* dst = cls.mutable_data();
  std::vector<std::int64_t> fixed, dead;
  for (const auto& r : out) {
    dst = std::copy(r.cls.begin(), r.cls.end(), dst);
    fixed.push_back(r.fixed_rows);
    dead.push_back(r.degenerate_rows);
  }
  auto per_image = [&](const std::vector<std::int64_t>& x) -> pyb::object {
    if (q0.single()) return pyb::cast(x.front());
    pyb::array_t<std::int64_t> a(std::vector<pyb::ssize_t>{q0.images()});
    std::copy(x.begin(), x.end(), a.mutable_data());
    return a;
  };
  pyb::dict d;
  d["cls"] = cls;
  d["fixed_rows"] = per_image(fixed);
  d["degenerate_rows"] = per_image(dead);
  return d;
}

/// Per mask: each (image, head)'s change (NaN where nothing was left to compare) and the per-head
/// totals over the images, folded in image order as `attnscope mask` folds a dump's layer.
pyb::dict mask(pyb::handle q_obj, pyb::handle k_obj, pyb::handle v_obj, const std::string& spec,
               const std::string& mask_specs, const std::vector<int>& grid_spec,
               std::uint64_t seed, int layer, const pyb::object& scale_obj,
               const std::string& convention) {
  const Variant var = variant_of(spec, convention);
  const std::vector<analyses::MaskSpec> masks = analyses::parse_mask_specs(mask_specs);
  const Heads<float> q(q_obj, "q"), k(k_obj, "k"), v(v_obj, "v");
  require_same_heads(q, k, true);
  require_same_heads(q, v, false);
  const TokenGrid grid = grid_of(grid_spec, q.tokens());
  const double scale = scale_or_default(scale_obj, q.dim());
  const auto nm = static_cast<Eigen::Index>(masks.size());
  // [head index * masks + mask]
  std::vector<analyses::MaskCell> parts(static_cast<std::size_t>(q.count() * nm));
  for_each_index(q.count() * nm, [&](Eigen::Index t) {
    const Eigen::Index i = t / nm, m = t % nm;
    const int image = q.single() ? 0 : static_cast<int>(i / q.heads());
    const int head = static_cast<int>(i % q.heads());
    const MatD qd = q.head(i).cast<double>(), kd = k.head(i).cast<double>(),
               vd = v.head(i).cast<double>();
    const Mask mk = analyses::build_mask(masks[static_cast<std::size_t>(m)], grid,
                                         analyses::mask_seed(seed, image, layer, head));
    parts[static_cast<std::size_t>(t)] = analyses::in_head(image, layer, head, [&] {
      return analyses::mask_head(var, qd, kd, vd, scale, mk);
    });
  });
  pyb::dict d;
  for (Eigen::Index m = 0; m < nm; ++m) {
    std::vector<double> change;
    std::vector<analyses::MaskCell> totals(static_cast<std::size_t>(q.heads()));
    for (Eigen::Index i = 0; i < q.count(); ++i) {  // images in order
      const analyses::MaskCell& c = parts[static_cast<std::size_t>(i * nm + m)];
      change.push_back(c.change.count > 0 ? c.change.mean
                                          : std::numeric_limits<double>::quiet_NaN());
      totals[static_cast<std::size_t>(i % q.heads())].merge(c);
    }
    std::vector<std::int64_t> values, removed_count, empty, dead, unmeasured;
    std::vector<double> mean, stddev, min, max, removed_mean, removed_std;
    for (const auto& c : totals) {
      values.push_back(c.change.count);
      mean.push_back(c.change.mean);
      stddev.push_back(c.change.stddev());
      min.push_back(c.change.min);
      max.push_back(c.change.max);
      removed_count.push_back(c.removed_mass.count);
      removed_mean.push_back(c.removed_mass.mean);
      removed_std.push_back(c.removed_mass.stddev());
      empty.push_back(c.empty_rows);
      dead.push_back(c.degenerate_rows);
      unmeasured.push_back(c.unmeasured_heads);
    }
    pyb::dict r;
    r["change"] = per_head_array(q, change);
    r["values"] = per_head_totals(q, values);
    r["change_mean"] = per_head_totals(q, mean);
    r["change_std"] = per_head_totals(q, stddev);
    r["change_min"] = per_head_totals(q, min);
    r["change_max"] = per_head_totals(q, max);
    r["removed_mass_queries"] = per_head_totals(q, removed_count);
    r["removed_mass_mean"] = per_head_totals(q, removed_mean);
    r["removed_mass_std"] = per_head_totals(q, removed_std);
    r["empty_rows"] = per_head_totals(q, empty);
    r["degenerate_rows"] = per_head_totals(q, dead);
    r["unmeasured_heads"] = per_head_totals(q, unmeasured);
    d[pyb::str(masks[static_cast<std::size_t>(m)].name())] = r;
  }
  return d;
}

pyb::list verify(std::uint64_t seed, int trials) {
  if (trials < 1) throw UsageError("trials must be >= 1, got " + std::to_string(trials));
  analyses::VerifyOptions opt;
  opt.seed = seed;
  opt.trials = trials;
  opt.timing = false;
  std::vector<analyses::CheckRow> rows;
  {
    pyb::gil_scoped_release release;
    rows = analyses::verify_all(opt);
  }
  pyb::list out;
  for (const auto& r : rows) {
    pyb::dict d;
    d["check"] = r.check;
    d["what"] = r.what;
    d["trials"] = r.trials;
    d["unusable_trials"] = r.unusable;
    d["margin"] = r.margin;
    d["threshold"] = r.threshold;
    d["sense"] = r.sense == analyses::CheckRow::Sense::Above ? "above" : "below";
    d["result"] = r.result();
    d["pass"] = r.pass;
    out.append(d);
  }
  return out;
}

}  // namespace

void bind_diagnostics(pyb::module_& m) {
  m.def("sinks", &sinks, pyb::arg("q"), pyb::arg("k"), pyb::arg("variant"), pyb::arg("threshold"),
        pyb::arg("scale"), pyb::arg("reference"), pyb::arg("convention"));
  m.def("token_norms", &token_norms, pyb::arg("x"), pyb::arg("ratio"));
  m.def("rollout", &rollout, pyb::arg("q"), pyb::arg("k"), pyb::arg("variant"),
        pyb::arg("fusion"), pyb::arg("scale"), pyb::arg("reference"), pyb::arg("convention"));
  m.def("mask", &mask, pyb::arg("q"), pyb::arg("k"), pyb::arg("v"), pyb::arg("variant"),
        pyb::arg("masks"), pyb::arg("grid"), pyb::arg("seed"), pyb::arg("layer"),
        pyb::arg("scale"), pyb::arg("convention"));
  m.def("verify", &verify, pyb::arg("seed"), pyb::arg("trials"));
}

}  // namespace attnscope::python
