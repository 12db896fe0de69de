// The local term's share of a layer's attention output: for dumps holding a module's local term
// apart (/layers/L/local: InLine's local residual, FLatten's depthwise convolution) beside
// /layers/L/out = W V, the part of what the module hands its output projection that is local.
#pragma once

#include "attnscope/analyses/dump_loop.hpp"
#include "attnscope/analyses/locality.hpp"
#include "attnscope/dump.hpp"

#include <vector>

namespace attnscope::analyses {

/// Per (layer, head), over images: share = |local|_F / (|out|_F + |local|_F), the Frobenius
/// norms over the image's grid tokens (prefix tokens left out): 0 when the local term is
/// nothing, 1 when W V is nothing.
struct LocalShareHead {
  int layer = 0;
  int head = 0;
  RunningStats share;
};

/// The share of every selected (layer, head) whose layer holds both `local` and `out`, over the
/// selection's images (resolved by dump_loop's resolve); layer-major. Empty when no selected
/// layer holds a local term.
[[nodiscard]] std::vector<LocalShareHead> local_share(DumpReader& reader, const Selection& sel);

}  // namespace attnscope::analyses
