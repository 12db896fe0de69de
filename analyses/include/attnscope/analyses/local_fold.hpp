// The local term folded into the attention map (locality --fold-local): a module whose output is
// W V + DWC(V), DWC a depthwise convolution of V's grid (InLine's local residual, FLatten's and
// PolaFormer's DWC, Agent attention's DWC, MLLA's and RALA's LePE), computes per channel c
// (W + M_c) V_c, M_c the convolution's token-to-token matrix: row i (an output cell) holds the
// kernel's tap (a, b) at the input cell (r_i + a - pad_h, c_i + b - pad_w) when that cell is on
// the grid (zero padding), nothing for prefix tokens. One map per head needs one M per head: the
// mean of M_c over the head's channels, i.e. M of the head's mean kernel (LocalKernel::head_mean;
// M is linear in the kernel). Where the head's channels share one kernel (FLatten's and
// PolaFormer's dwc per channel of a head, or a test's kernel) the folded map times V is exactly
// out + local - bias; otherwise it is the map whose output is the head's mean channel's.
// With windows the convolution runs over each window's grid (window tokens row by row).
//
// The folded local mass of a query is the folded row's sum over the keys in the query's k x k
// window (the same windows as locality's): W's mass plus the mean kernel's taps that land there.
#pragma once

#include "attnscope/analyses/dump_loop.hpp"
#include "attnscope/analyses/locality.hpp"
#include "attnscope/dump.hpp"
#include "attnscope/dump_local_kernel.hpp"
#include "attnscope/geometry.hpp"
#include "attnscope/variant.hpp"

#include <vector>

namespace attnscope::analyses {

/// M of one kernel (kh x kw, cross-correlation as Conv2d, zero padding) over a height x width
/// grid whose cells are numbered row by row: (height * width) x (height * width).
[[nodiscard]] MatD depthwise_matrix(const MatD& kernel, int pad_height, int pad_width, int height,
                                    int width);

/// The folded map of unit `unit` of a layer (geometry.hpp: a window, or the layer's one
/// attention): `w` (unit_queries x unit_keys, e.g. unit_rows' weights) plus the depthwise matrix of
/// `kernel` on the unit's grid tokens (prefix rows and columns left as they are). UsageError for
/// a layer with keys from a reduced grid (the convolution maps the layer's own tokens).
[[nodiscard]] MatD folded_unit_map(const MatD& w, const MatD& kernel, int pad_height, int pad_width,
                                   const LayerGeometry& geo);

/// Fast folded masses: `mass` (local_mass's or local_mass_units' entries for the head, NaN for
/// prefix tokens and degenerate rows, kept NaN) plus, per query, the taps of the head's mean
/// kernel of its unit whose input cell lies in the query's k x k window.
[[nodiscard]] std::vector<double> folded_local_mass(const std::vector<double>& mass,
                                                    const LocalKernel& kernel, int head,
                                                    const LayerGeometry& geo, int window);

/// Reference: every unit's explicit folded map (unit_rows + folded_unit_map, in double), summed
/// over the keys whose cell lies in the query's window, found by scanning every key.
[[nodiscard]] std::vector<double> folded_local_mass_reference(
    const Variant& v, const MatF& q, const MatF& k, double scale, const LayerGeometry& geo,
    const LocalKernel& kernel, int head, int window, int* degenerate = nullptr);

/// Per (variant, layer, head) over the selection's images: the statistics of the folded masses.
struct FoldedLocality {
  std::vector<std::vector<LocalityHead>> per_head;  ///< [variant][slot*heads+h], as LocalityResult
  std::int64_t images = 0;
};

/// UsageError, naming the file, the model layer and the layers that have one, for the first of
/// `layers` (dump layers) without /layers/L/local_kernel or with keys from a reduced grid; the
/// first image's kernel of each is read, so that a damaged one (read_local_kernel's InputError)
/// stops a run before it starts.
void require_local_kernels(const DumpSchema& schema, const std::vector<int>& layers);

/// Streams the selection (resolved) with every selected layer's kernel read up front (one
/// image's is a head_dim x kh x kw block per head and window: a small part of its q). A selected
/// layer without /layers/L/local_kernel, or with keys from a reduced grid, is a UsageError naming
/// the file and the layer and the layers that have a kernel. `reference` uses
/// folded_local_mass_reference, else local_mass (local_mass_units for layers of another geometry)
/// and folded_local_mass.
[[nodiscard]] FoldedLocality folded_locality(DumpReader& reader, const Selection& resolved,
                                             const std::vector<Variant>& variants, int window,
                                             bool reference);

}  // namespace attnscope::analyses
