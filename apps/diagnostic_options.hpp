// The flags the per-head diagnostics (distance, entropy, sinks, rank, rollout) share, in the order
// their --help lists them: the inputs before each command's own flags, the run after them.
#pragma once

#include "common.hpp"
#include "image_run.hpp"
#include "selection_flags.hpp"

#include <string>

namespace attnscope::app {

/// --dump, --out (default `out_default`), --variant, and the selection with --transform.
inline void add_diagnostic_input_options(po::options_description& d, CommonOptions& common,
                                         SelectionFlags& sel, const std::string& out_default) {
  add_dump_option(d, common);
  add_out_option(d, common, out_default);
  add_variant_option(d, common);
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

}  // namespace attnscope::app
