// The module's parts: each bind_* adds its functions to the module (module.cpp calls them).
#pragma once

#include "attnscope/analyses/dump_loop.hpp"
#include "attnscope/analyses/query_stats.hpp"
#include "attnscope/variant.hpp"

#include <pybind11/pybind11.h>

#include <string>

namespace attnscope::python {

/// A variant spec parsed with `convention` as its default convention ("paper" or "code");
/// UsageError for a spec that does not parse or a variant this build cannot compute.
Variant variant_of(const std::string& spec, const std::string& convention);

/// One layer's selection of `heads` heads: the slots of the analyses' totals, a stack of heads
/// [images, heads, tokens, dim] being one layer of a dump.
analyses::Selection one_layer(Eigen::Index heads);

/// An analysis of query_stats.hpp by name ("entropy", "distance", "rank"), with its options:
/// entropy log_eps, bins (32); distance grid (prefix, height, width), patch_size (pixels, 1),
/// renormalise, bins (32); rank rank_tol. Unknown names and options are refused (UsageError).
struct QueryMeasure {
  analyses::QueryStatsLayout layout;
  analyses::HeadMeasureFn fn;
  bool need_v = false;
};
QueryMeasure query_measure(const std::string& name, const pybind11::dict& options,
                           Eigen::Index tokens, double scale, bool reference);

void bind_attention(pybind11::module_& m);
void bind_analyses(pybind11::module_& m);
void bind_query_stats(pybind11::module_& m);
void bind_live(pybind11::module_& m);
void bind_diagnostics(pybind11::module_& m);

}  // namespace attnscope::python
