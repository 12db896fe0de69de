// The flags the per-head diagnostics (distance, entropy, sinks, rank, rollout) share, in the order
// their --help lists them: the inputs before each command's own flags, the run after them.
#pragma once

#include "common.hpp"
#include "attnscope/run/image_run.hpp"
#include "model_layers.hpp"
#include "selection_flags.hpp"

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace attnscope::app {

/// --dump, --out (default `out_default`), --variant, and the selection with --transform.
inline void add_diagnostic_input_options(po::options_description& d, CommonOptions& common,
                                         SelectionFlags& sel, const std::string& out_default) {
  add_dump_option(d, common);
  add_out_option(d, common, out_default);
  add_variant_option(d, common, dumps_own_variant(true));
  add_selection_options(d, sel, true);
}

/// --threads, --device, --seed, --resume and --shard.
inline void add_diagnostic_run_options(po::options_description& d, CommonOptions& common,
                                       RunControl& control) {
  add_threads_option(d, common);
  add_device_option(d, common);
  add_seed_option(d, common);
  add_run_control_options(d, control);
}

/// The run parameters every diagnostic records beside its own (which the caller adds): the
/// variants (with each layer's own, `own_names`: {"each_layer_own": {layer: name}}), the selection
/// (transform, images, layers, heads), --reference, the threads, the seed and the device.
inline nlohmann::json diagnostic_params(const std::vector<Variant>& variants,
                                        const analyses::Selection& sel, const DumpSchema& schema,
                                        bool reference, int threads, const CommonOptions& common,
                                        const ResolvedDevice& device,
                                        const std::map<int, std::string>& own_names = {}) {
  return {{"variants", variants_json(variants, own_names)},
          {"transform", sel.transform.name()},
          {"images", sel.images.size()},
          {"layers", model_layers_of(schema, sel.layers)},
          {"heads", sel.heads},
          {"reference", reference},
          {"threads", threads},
          {"seed", common.seed},
          {"device", device.description}};
}

/// A diagnostic's selection with each layer's own variant where --variant was left out and the
/// layers read differ in family (layers_own_variants); `own_names` receives their names by model
/// layer (empty otherwise). `geometry_why`: why the diagnostic refuses layers of another shape
/// (Selection::geometry_why).
inline analyses::Selection with_own_variants(analyses::Selection sel, const CommonOptions& common,
                                             const DumpSchema& schema,
                                             std::map<int, std::string>& own_names,
                                             std::string geometry_why) {
  sel.geometry_why = std::move(geometry_why);
  sel.own_variants = layers_own_variants(common, schema, sel.layers);
  own_names = own_variant_names(schema, sel.own_variants, sel.layers);
  return sel;
}

}  // namespace attnscope::app
