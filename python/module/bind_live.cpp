// The live analyses (live.hpp) as Python objects: attnscope.analyze makes one per analysis, hands
// it every batch's q and k of the analysed layers, and publishes its result set at the end.
#include "arrays.hpp"
#include "bindings.hpp"
#include "live.hpp"

#include "attnscope/error.hpp"

#include <cmath>
#include <memory>

namespace attnscope::python {

namespace {

/// A batch's layers: each a [images, heads, tokens, dim] array (None: none given).
std::vector<Heads<float>> layers_of(const pyb::object& arrays, const char* name) {
  std::vector<Heads<float>> out;
  if (arrays.is_none()) return out;
  for (pyb::handle a : arrays) out.emplace_back(a, name);
  return out;
}

std::unique_ptr<LiveAnalysis> make_live(const std::string& analysis, const std::string& out_dir,
                                        const std::vector<std::string>& specs,
                                        const std::vector<int>& model_layers, int heads,
                                        const std::vector<int>& grid, double scale,
                                        const pyb::dict& options, const std::string& convention) {
  if (specs.empty()) throw UsageError("variants: expected at least one variant");
  if (model_layers.empty()) throw UsageError("layers: expected at least one layer");
  if (heads < 1) throw UsageError("heads: expected at least one head, got " + std::to_string(heads));
  if (!std::isfinite(scale) || scale == 0.0) {
    throw UsageError("scale: expected a finite non-zero number, got " + std::to_string(scale));
  }
  LiveSetup setup;
  for (const auto& s : specs) setup.variants.push_back(variant_of(s, convention));
  setup.model_layers = model_layers;
  setup.heads = heads;
  setup.scale = scale;
  setup.grid = grid_shape(grid);
  if (analysis == "locality") {
    require_known_options(analysis, options, {"window"});
    return std::make_unique<LiveLocality>(std::move(setup), option(options, "window", 3), out_dir);
  }
  if (analysis == "census") {
    require_known_options(analysis, options, {"sum_tol"});
    const double tol = option(options, "sum_tol", analyses::kDefaultSumTolerance);
    return std::make_unique<LiveCensus>(std::move(setup), tol, out_dir);
  }
  if (analysis == "confusion") {
    require_known_options(analysis, options, {"eps", "query_eps"});
    analyses::ConfusionOptions opt;
    opt.eps = option(options, "eps", opt.eps);
    opt.query_eps = option(options, "query_eps", opt.query_eps);
    analyses::check_confusion_options(opt);
    return std::make_unique<LiveConfusion>(std::move(setup), opt, out_dir);
  }
  if (analysis == "entropy" || analysis == "distance" || analysis == "rank") {
    return std::make_unique<LiveQueryStats>(std::move(setup), analysis, options, out_dir);
  }
  throw UsageError("analyses: expected locality, census, confusion, entropy, distance or rank, "
                   "got '" + analysis + "'");
}

}  // namespace

void bind_live(pyb::module_& m) {
  pyb::class_<LiveAnalysis>(m, "LiveAnalysis")
      .def(
          "add",
          [](LiveAnalysis& a, const pyb::object& q, const pyb::object& k, const pyb::object& v,
             const pyb::object& out) {
            a.add(LiveBatch{layers_of(q, "q"), layers_of(k, "k"), layers_of(v, "v"),
                            layers_of(out, "out")});
          },
          pyb::arg("q"), pyb::arg("k"), pyb::arg("v") = pyb::none(), pyb::arg("out") = pyb::none())
      .def(
          "publish",
          [](LiveAnalysis& a, const std::string& record) {
            if (a.images() == 0) {
              throw UsageError("no images: no batch was added, nothing to publish");
            }
            nlohmann::json j = nlohmann::json::parse(record, nullptr, false);
            if (!j.is_object()) throw UsageError("record: expected a JSON object");
            return a.publish(std::move(j));
          },
          pyb::arg("record"))
      .def_property_readonly("images", &LiveAnalysis::images)
      .def_property_readonly("needs_v", &LiveAnalysis::needs_v);
  m.def("live", &make_live, pyb::arg("analysis"), pyb::arg("out_dir"), pyb::arg("variants"),
        pyb::arg("layers"), pyb::arg("heads"), pyb::arg("grid"), pyb::arg("scale"),
        pyb::arg("options"), pyb::arg("convention"));
}

}  // namespace attnscope::python
