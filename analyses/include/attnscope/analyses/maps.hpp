// Attention maps (the papers' attention-map figures): the weights of one query token's row laid
// out on the patch grid, H x W, plus the weights it gives to the prefix tokens.
#pragma once

#include "attnscope/analyses/confusion.hpp"
#include "attnscope/analyses/dump_loop.hpp"
#include "attnscope/dump.hpp"
#include "attnscope/variant.hpp"
#include "attnscope/layout.hpp"

#include <cstddef>
#include <functional>
#include <string_view>
#include <vector>

namespace attnscope::analyses {

struct AttentionMap {
  int token = 0;       ///< the query token
  int query_row = -1;  ///< its grid row, -1 for a prefix token
  int query_col = -1;  ///< its grid column, -1 for a prefix token
  MatD grid;           ///< height x width: weight of the key at each grid cell
  std::vector<double> prefix;  ///< weights of the prefix keys, in token order
};

/// The map of one query's row (computed in double by ExactRows; zeros for a degenerate row).
AttentionMap attention_map(const ExactRows& rows, const TokenGrid& grid, int token);

/// One map of a run: the row of query map.token of one head under one variant.
struct MapEntry {
  std::size_t variant = 0;  ///< index into the run's variants
  int image = 0;
  int layer = 0;  ///< the dump's layer index
  int head = 0;
  AttentionMap map;
};

struct MapsRun {
  long long maps = 0;             ///< maps handed to on_image
  long long degenerate_rows = 0;  ///< rows without weights: no map rather than a map of zeros
};

/// One image's maps, ordered as run_maps hands them on, and its degenerate rows (no map).
struct MapsImage {
  int image = 0;
  std::vector<MapEntry> maps;
  long long degenerate_rows = 0;
};

/// Streams the selection as run_maps does, handing each image's maps to `sink` in the
/// selection's order.
void maps_images(DumpReader& reader, const Selection& resolved, const std::vector<Variant>& variants,
                 const std::vector<int>& tokens, const std::function<void(MapsImage&&)>& sink);

/// The maps of the given query tokens under every variant for every selected head, streamed by
/// for_each_head (V is not read). After each image, on_image receives that image's maps ordered
/// by variant, then the model's layer index (DumpSchema::model_layer, as results report layers),
/// head and token; they are dropped after the call. A degenerate row gets no map and is counted.
MapsRun run_maps(DumpReader& reader, const Selection& resolved,
                 const std::vector<Variant>& variants, const std::vector<int>& tokens,
                 const std::function<void(int image, const std::vector<MapEntry>& maps)>&
                     on_image);

/// Parses "--tokens": comma-separated token indices ("0,17") or grid cells "ROW:COL" ("7:7").
/// Throws UsageError naming the bad item (malformed, outside the grid, or a token named twice).
std::vector<int> parse_tokens(std::string_view spec, const TokenGrid& grid);

}  // namespace attnscope::analyses
