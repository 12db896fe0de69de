// The module's parts: each bind_* adds its functions to the module (module.cpp calls them).
#pragma once

#include "attnscope/analyses/dump_loop.hpp"
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

void bind_attention(pybind11::module_& m);
void bind_analyses(pybind11::module_& m);
void bind_query_stats(pybind11::module_& m);
void bind_live(pybind11::module_& m);

}  // namespace attnscope::python
