// The shape of one layer's attention (docs/dump-format.md, "Per-layer geometry"): its heads and
// head dim, the token grid of its queries, the grid its keys come from (fewer key tokens than
// queries under PVT's spatial reduction), and Swin's windows (each window one attention of its
// own, the shifted-window mask a per-window set of allowed pairs).
//
// A layer's q of one head is always one matrix: without windows, its `query_tokens()` rows in
// token order (layout.hpp); with windows, the windows one after the other, window w's tokens at
// rows [w * window_tokens(), (w + 1) * window_tokens()), each token's grid cell in `positions`.
// k and v are laid out the same with key_tokens() rows per unit.
#pragma once

#include "attnscope/layout.hpp"

#include <memory>
#include <string>
#include <vector>

namespace attnscope {

struct LayerGeometry {
  int num_heads = 0;
  int head_dim = 0;
  double scale = 0.0;
  TokenGrid grid;      ///< the queries' grid (with windows: the stage's grid the windows tile)
  TokenGrid key_grid;  ///< the keys' grid: `grid` itself unless spatially reduced
  int windows = 0;     ///< 0: one attention over all tokens; else the number of windows
  int window_height = 0, window_width = 0;
  int shift = 0;  ///< the cyclic shift of the windows (0: unshifted), recorded for reports
  /// With windows: the grid cell (row, col) of every window token, [window][token][2] flat.
  std::vector<int> positions;
  /// With windows and a mask: 1 where query i of window w may attend to key j,
  /// [window][query][key] flat. Empty: every pair of a window is allowed.
  std::vector<unsigned char> window_mask;
  /// CSwin's stripes (two stripe shapes in one layer): with windows, the heads from
  /// `second_heads_from` on attend within the windows of `second` (the same number of windows and
  /// of tokens per window, its own window_height x window_width and positions, no mask); the
  /// heads before it within this geometry's. 0 and null: one shape for every head.
  int second_heads_from = 0;
  std::shared_ptr<const LayerGeometry> second;

  /// The geometry head `head` attends in: `*second` for the second shape's heads, else this.
  [[nodiscard]] const LayerGeometry& for_head(int head) const {
    return second != nullptr && head >= second_heads_from ? *second : *this;
  }

  /// Attention units of one head: its windows, or 1.
  [[nodiscard]] int units() const { return windows > 0 ? windows : 1; }
  /// Tokens of one window (0 without windows).
  [[nodiscard]] int window_tokens() const { return window_height * window_width; }
  /// Query rows of one unit (a window's tokens, or the grid's tokens).
  [[nodiscard]] int unit_queries() const { return windows > 0 ? window_tokens() : grid.tokens(); }
  /// Key rows of one unit.
  [[nodiscard]] int unit_keys() const { return windows > 0 ? window_tokens() : key_grid.tokens(); }
  /// Rows of a head's q (every unit's), and of its k and v.
  [[nodiscard]] int query_rows() const { return units() * unit_queries(); }
  [[nodiscard]] int key_rows() const { return units() * unit_keys(); }
  /// Whether keys come from a smaller grid than the queries.
  [[nodiscard]] bool reduced() const {
    return windows == 0 && (key_grid.height != grid.height || key_grid.width != grid.width);
  }
  /// The layout every analysis knows: no windows, keys = queries.
  [[nodiscard]] bool square() const { return windows == 0 && !reduced(); }
  /// Whether window w has a mask that forbids some pair.
  [[nodiscard]] bool masked(int w) const;
  /// Window w's mask as the library takes it (layout.hpp's Mask: true = kept); all true
  /// without a mask; a single all-true mask for a layer without windows of its key count.
  [[nodiscard]] Mask unit_mask(int w) const;
  /// The grid cell (row, col) of query `i` of unit `w` (-1, -1 for a prefix token).
  [[nodiscard]] std::pair<int, int> query_cell(int w, int i) const;
  /// The cell of key `j` of unit `w` on key_grid (-1, -1 for a prefix token).
  [[nodiscard]] std::pair<int, int> key_cell(int w, int j) const;
  /// One line for results and messages, e.g. "3 heads x 64, grid 14x14+1",
  /// "2 heads x 32, grid 8x8, keys 4x4 (spatial reduction)",
  /// "4 heads x 32, 16 windows of 7x7 on 28x28, shift 3",
  /// "4 heads x 32, 4 windows of 2x8 on 8x8, heads 2.. in 4 windows of 8x2" (stripes).
  [[nodiscard]] std::string describe() const;
  /// Same shape (heads, dims, grids, windows, positions and masks) and scale.
  [[nodiscard]] bool operator==(const LayerGeometry& o) const;
  [[nodiscard]] bool operator!=(const LayerGeometry& o) const { return !(*this == o); }
};

}  // namespace attnscope
