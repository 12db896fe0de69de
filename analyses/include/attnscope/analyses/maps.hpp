// Attention maps (the papers' attention-map figures): the weights of one query token's row laid
// out on the patch grid, H x W, plus the weights it gives to the prefix tokens.
#pragma once

#include "attnscope/analyses/confusion.hpp"
#include "attnscope/layout.hpp"

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

/// Parses "--tokens": comma-separated token indices ("0,17") or grid cells "ROW:COL" ("7:7").
/// Throws UsageError naming the bad item (malformed, outside the grid, or a token named twice).
std::vector<int> parse_tokens(std::string_view spec, const TokenGrid& grid);

}  // namespace attnscope::analyses
