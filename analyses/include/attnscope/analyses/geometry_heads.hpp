// Confusion, local mass and maps of heads whose layer is not one square attention over the dump's
// grid (geometry.hpp): Swin's windows (each window its own attention, the shifted windows' mask
// applied as attention.hpp's Mask), PVT's keys from a spatially reduced grid. Each unit (a window,
// or the layer's one attention) is computed apart in double through its explicit weights
// (attention_weights<double> with the unit's mask), and every decision is the one the square
// analyses make: the same squared_distance, the same windows on the grid.
//
// What the quantities mean there:
//  - confusion: pairs i < j of one unit (a window's queries, or the layer's queries against the
//    reduced keys); queries of different windows attend to different keys and are never paired;
//  - local mass: the weight of the keys whose grid cell lies in the k x k window around the
//    query's cell; with reduced keys the query's cell is first mapped onto the key grid
//    (row * key_height / height, col * key_width / width, rounded down). The uniform baseline is
//    what a row uniform over the unit's allowed keys puts there;
//  - maps: the row of a query laid out on the key grid (a window's keys at their cells, 0 on the
//    cells outside the window).
// Tests compare these, on square layers, with the fast analyses and their references.
#pragma once

#include "attnscope/analyses/confusion.hpp"
#include "attnscope/analyses/maps.hpp"
#include "attnscope/dump.hpp"
#include "attnscope/geometry.hpp"
#include "attnscope/variant.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace attnscope::analyses {

/// Per dump layer: whether its heads go unit by unit here (windows, reduced keys, or a grid other
/// than the root's) rather than through the square analyses; true only for layers in `layers`.
std::vector<char> layers_by_units(const DumpSchema& schema, const std::vector<int>& layers);

/// UsageError naming `analysis` when a head (q: query_rows() x d, k: key_rows() x d) is not of
/// the layer's geometry.
void check_unit_head(const std::string& analysis, const MatF& q, const MatF& k,
                     const LayerGeometry& geo);

/// One unit's rows: its explicit weights in double (degenerate rows zero) and which are degenerate.
struct UnitRows {
  MatD w;                       ///< unit_queries() x unit_keys()
  std::vector<char> degenerate; ///< per query of the unit
};
/// Unit `unit` of a head (q: query_rows() x d, k: key_rows() x d of the layer's geometry).
UnitRows unit_rows(const Variant& v, const MatF& q, const MatF& k, double scale,
                   const LayerGeometry& geo, int unit);

/// Whether key j of unit u lies in the k x k window of query i's cell (locality's rule above;
/// false for a prefix query or key).
bool near_cell(const LayerGeometry& geo, int unit, int i, int j, int window);

/// Unit `unit`'s mask (attention.hpp's, true = kept) under one of masking.hpp's removals: its own
/// mask (unit_mask), and for every grid query the keys near_cell(..., k) removed (`local`), or
/// `size` keys (as many as there are) drawn uniformly without replacement among its allowed grid
/// keys outside its 3 x 3 window (random: std::mt19937_64 from `seed`, a partial Fisher-Yates
/// shuffle over the keys in unit order, as random_outside_mask draws). Prefix queries and keys
/// are never touched.
Mask unit_removal_mask(const LayerGeometry& geo, int unit, bool local, int size,
                       std::uint64_t seed);

/// Confusion of a head of any geometry: each unit's pairs, brute force over its rows, summed.
/// Excluded tokens are not taken (their masks are over the dump's root tokens).
HeadConfusion count_confusion_units(const Variant& v, const MatF& q, const MatF& q_raw,
                                    const MatF& k, double scale, const LayerGeometry& geo,
                                    const ConfusionOptions& opt);

/// Local mass of every query row of a head of any geometry (query_rows() entries, NaN for prefix
/// tokens and degenerate rows); `degenerate` receives the number of degenerate grid rows.
std::vector<double> local_mass_units(const Variant& v, const MatF& q, const MatF& k, double scale,
                                     const LayerGeometry& geo, int window, int* degenerate = nullptr);
/// What a row uniform over each unit's allowed keys puts in the windows, averaged over the
/// layer's grid queries.
double uniform_baseline_units(const LayerGeometry& geo, int window);

/// The cell of the layer's grid that stands for `token` of the dump's root grid: the same cell,
/// scaled onto the layer's grid (row * height / root height, rounded down). UsageError naming
/// the layer when the token is a prefix token and the layer has none.
int layer_token(const TokenGrid& root, const LayerGeometry& geo, int token, int model_layer);
/// The map of the query row standing for root token `token` (layer_token) in a head of any
/// geometry; nullopt when the row is degenerate. The map's grid is the key grid; its token is
/// `token`, its query_row/col the query's cell on the layer's grid.
std::optional<AttentionMap> attention_map_units(const Variant& v, const MatF& q, const MatF& k,
                                                double scale, const LayerGeometry& geo,
                                                const TokenGrid& root, int token, int model_layer);

}  // namespace attnscope::analyses
