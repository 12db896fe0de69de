// The live analyses (live.hpp) as Python objects: attnscope.analyze makes one per analysis, hands
// it every batch's q and k of the analysed layers, and publishes its result set at the end.
#include "arrays.hpp"
#include "bindings.hpp"
#include "live.hpp"

#include "attnscope/error.hpp"

#include <memory>

namespace attnscope::python {

namespace {

/// A batch's layers: each a [images, heads, tokens, dim] array.
std::vector<Heads<float>> layers_of(const pyb::list& arrays, const char* name) {
  std::vector<Heads<float>> out;
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
  LiveSetup setup;
  for (const auto& s : specs) setup.variants.push_back(variant_of(s, convention));
  setup.model_layers = model_layers;
  setup.heads = heads;
  setup.scale = scale;
  if (grid.size() != 3) throw UsageError("grid: expected (prefix_tokens, height, width)");
  setup.grid = {grid[0], grid[1], grid[2]};
  if (analysis == "locality") {
    const int window = options.contains("window") ? options["window"].cast<int>() : 3;
    return std::make_unique<LiveLocality>(std::move(setup), window, out_dir);
  }
  if (analysis == "census") {
    const double tol = options.contains("sum_tol") ? options["sum_tol"].cast<double>()
                                                   : analyses::kDefaultSumTolerance;
    return std::make_unique<LiveCensus>(std::move(setup), tol, out_dir);
  }
  if (analysis == "confusion") {
    analyses::ConfusionOptions opt;
    if (options.contains("eps")) opt.eps = options["eps"].cast<double>();
    if (options.contains("query_eps")) opt.query_eps = options["query_eps"].cast<double>();
    return std::make_unique<LiveConfusion>(std::move(setup), opt, out_dir);
  }
  throw UsageError("analyses: expected locality, census or confusion, got '" + analysis + "'");
}

}  // namespace

void bind_live(pyb::module_& m) {
  pyb::class_<LiveAnalysis>(m, "LiveAnalysis")
      .def(
          "add",
          [](LiveAnalysis& a, const pyb::list& q, const pyb::list& k) {
            a.add(layers_of(q, "q"), layers_of(k, "k"));
          },
          pyb::arg("q"), pyb::arg("k"))
      .def(
          "publish",
          [](LiveAnalysis& a, const std::string& record) {
            return a.publish(nlohmann::json::parse(record));
          },
          pyb::arg("record"))
      .def_property_readonly("images", &LiveAnalysis::images);
  m.def("live", &make_live, pyb::arg("analysis"), pyb::arg("out_dir"), pyb::arg("variants"),
        pyb::arg("layers"), pyb::arg("heads"), pyb::arg("grid"), pyb::arg("scale"),
        pyb::arg("options"), pyb::arg("convention"));
}

}  // namespace attnscope::python
