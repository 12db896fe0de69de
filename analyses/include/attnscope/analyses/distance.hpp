// Mean attention distance (Dosovitskiy et al. 2021, Fig. 7; Raghu et al. 2021), per layer and
// head, as the ViT papers compute it: for each grid query i,
//
//     d_i = sum_{j on the grid} w_ij * dist(i, j),
//     dist(i, j) = sqrt((dr * patch_height)^2 + (dc * patch_width)^2) pixels,
//
// dr, dc the grid rows and columns between query i and key j. Prefix tokens (CLS, distillation)
// are dropped as queries and as keys; the rows are NOT renormalised over the grid keys unless
// DistanceOptions::renormalise (then d_i is divided by the row's grid mass sum_{j on grid} w_ij).
// Per head: d_i averaged over the queries of an image, then over images (query_stats.hpp).
//
// Weights come from the registry (attention.hpp), every family alike. Where a family's weights
// can be negative (InLine, MALA), d_i is computed with the signed weights as given: it is then a
// signed sum, not a mean over a distribution, and can fall below 0 or beyond the largest
// distance. Rows with a negative weight among their grid keys are counted.
//
// Layers of another geometry (geometry.hpp) are measured in their own stage's grid, each token at
// the centre of its patch:
//  - the stage's patch is the dump's patch scaled to the stage's grid: patch_height * root grid
//    height / the layer's grid height (and the same for the width), so that every stage spans
//    the same image;
//  - Swin's windows: query and key are cells of the stage's grid (their positions as the dump
//    records them, before the cyclic shift), d_i the sum over the keys of the query's window,
//    pairs the shifted-window mask forbids weigh 0;
//  - PVT's spatial reduction: key j of the Hk x Wk key grid stands for the block of the H x W
//    query grid that it pools, at that block's centre in the query grid's coordinates: row
//    (kr + 1/2) H / Hk - 1/2, column (kc + 1/2) W / Wk - 1/2 (query cell r at row r). The
//    reduced grid is stretched over the query grid: with PVT's floor (9 rows reduced by 2 to 4)
//    a key's centre lies a fraction of a cell from its convolution window's;
//  - a stage of its own grid without reduction: the square measure on that grid.
#pragma once

#include "attnscope/analyses/query_stats.hpp"
#include "attnscope/dump.hpp"
#include "attnscope/geometry.hpp"
#include "attnscope/layout.hpp"
#include "attnscope/variant.hpp"

#include <string>
#include <vector>

namespace attnscope::analyses {

/// Where the patches sit in pixels: the token grid and one patch's height and width.
class PatchGeometry {
 public:
  /// UsageError unless both sizes are positive and finite.
  PatchGeometry(const TokenGrid& grid, double patch_height, double patch_width);
  [[nodiscard]] const TokenGrid& grid() const { return grid_; }
  [[nodiscard]] double patch_height() const { return ph_; }
  [[nodiscard]] double patch_width() const { return pw_; }
  /// Pixels between grid cells dr rows and dc columns apart (dr, dc >= 0), from a table.
  [[nodiscard]] double distance(int dr, int dc) const {
    return table_[static_cast<std::size_t>(dr) * static_cast<std::size_t>(grid_.width) +
                  static_cast<std::size_t>(dc)];
  }
  /// The table's row for dr (grid_.width entries, indexed by dc).
  [[nodiscard]] const double* row(int dr) const {
    return table_.data() + static_cast<std::size_t>(dr) * static_cast<std::size_t>(grid_.width);
  }
  /// The distances from a cell in column ci to the cells of a grid row dr rows away, in column
  /// order: entry c is distance(dr, |c - ci|), c < grid width (a slice of a table, contiguous).
  [[nodiscard]] const double* centred_row(int dr, int ci) const {
    return centred_.data() +
           static_cast<std::size_t>(dr) * static_cast<std::size_t>(2 * grid_.width - 1) +
           static_cast<std::size_t>(grid_.width - 1 - ci);
  }
  /// Grids of at most this many cells (24 x 24: 384-pixel images in 16-pixel patches) also keep
  /// every cell's distances to every cell (cell_row): at most 2.7 MB.
  static constexpr int kCellTableCells = 576;
  /// The distances from grid cell `cell` (row-major, < cells) to every grid cell in row-major
  /// order, the values of centred_row laid end to end; nullptr on grids above kCellTableCells.
  [[nodiscard]] const double* cell_row(int cell) const {
    if (cells_.empty()) return nullptr;
    const auto count =
        static_cast<std::size_t>(grid_.height) * static_cast<std::size_t>(grid_.width);
    return cells_.data() + static_cast<std::size_t>(cell) * count;
  }
  /// The distances from grid cell `cell` (row-major) to every grid cell, in row-major order, into
  /// out (height x width entries): what cell_row holds, for grids of any size.
  void cell_distances(int cell, double* out) const;
  /// The largest distance on the grid (opposite corners; 0 for a single cell).
  [[nodiscard]] double max_distance() const;

 private:
  TokenGrid grid_;
  double ph_ = 1.0, pw_ = 1.0;
  std::vector<double> table_;    // [dr][dc]
  std::vector<double> centred_;  // [dr][dc + width - 1], dc in (-width, width)
  std::vector<double> cells_;    // [cell][cell], grids of at most kCellTableCells cells
};

/// What uniform rows give: the mean over grid queries of sum_{j on grid} dist(i, j) / N, or / G
/// (the grid's cells) with renormalise. The baseline a head's mean distance compares with.
[[nodiscard]] double uniform_distance(const PatchGeometry& geometry, bool renormalise);

/// The patch size a dump implies, and where it came from.
struct PatchSize {
  double height = 1.0;
  double width = 1.0;
  /// "--patch-size" (given), "/images" (image size / grid), or "grid" (neither: distances in
  /// patches, patch size 1).
  std::string source;
  /// The size /images implies, when the dump has /images and it divides evenly (0 otherwise):
  /// recorded beside a --patch-size that overrides it.
  double images_height = 0.0, images_width = 0.0;
};

/// `flag` > 0: that size (square patches). Otherwise the size /images implies: its height and
/// width over the grid's, which must divide them (InputError naming the file, /images, the grid
/// and the image size otherwise: pass --patch-size). Without /images, patch size 1 ("grid").
[[nodiscard]] PatchSize patch_size_of(const DumpReader& reader, double flag);

struct DistanceOptions {
  bool renormalise = false;  ///< divide each row by its mass on the grid keys
};

/// One head's distances: per token (N entries), NaN for prefix tokens, degenerate rows and, with
/// renormalise, rows without grid mass.
struct DistanceRows {
  std::vector<double> distance;   ///< d_i in pixels
  std::vector<double> grid_mass;  ///< sum_{j on grid} w_ij (1 - the prefix keys' mass)
  int degenerate = 0;             ///< degenerate grid rows (attention.hpp)
  int negative_rows = 0;          ///< measured grid rows with a negative weight on a grid key
  /// renormalise: grid rows whose grid mass is not above kTinyDenominator * sum_j |w_ij| (zero,
  /// negative or tiny: signed weights), left out. 0 without renormalise.
  int without_grid_mass = 0;
};

/// The fast path. Softmax heads within the float range (float_softmax_rows.hpp: logit error bound
/// delta <= 2^-12): float exponentials from one fixed-order GEMM, each row's sums against the
/// distance table in double; distance and grid mass within a relative 2 r / (1 - r) of the exact
/// ones, r = expm1(delta) + 2^-22 < 2.5e-4 (measured on DeiT-T-shaped heads: below 1e-6). Other
/// heads: the registry's weights in double (attention_weights), each row's sum against the table.
/// O(N^2 d) per head. The same bits on every CPU and thread count.
[[nodiscard]] DistanceRows attention_distance(const Variant& v, const MatF& q, const MatF& k,
                                              double scale, const PatchGeometry& geometry,
                                              const DistanceOptions& opt);
/// Plain loops: ExactRows' double rows, each key's distance from its grid coordinates.
[[nodiscard]] DistanceRows attention_distance_reference(const Variant& v, const MatF& q,
                                                        const MatF& k, double scale,
                                                        const PatchGeometry& geometry,
                                                        const DistanceOptions& opt);

/// The stage's patch of a layer: the dump's patch (`root`'s) scaled by the root grid's height and
/// width over the layer's grid's, {height, width} in pixels.
[[nodiscard]] std::pair<double, double> layer_patch(const PatchGeometry& root,
                                                    const LayerGeometry& geo);
/// Key j of unit u of a layer at its position in the query grid's cells, {row, col} (distance.hpp:
/// a window's key at its cell, a reduced key at the centre of the block it pools); {-1, -1} for a
/// prefix key.
[[nodiscard]] std::pair<double, double> key_position(const LayerGeometry& geo, int u, int j);
/// Whether a layer is measured unit by unit (windows, reduced keys, or a grid other than `root`'s).
[[nodiscard]] bool distance_by_units(const PatchGeometry& root, const LayerGeometry& geo);
/// A head of any layer geometry: each unit's rows (the registry's weights in double, the unit's
/// mask applied), each grid query's distances to the unit's grid keys in the stage's pixels
/// (layer_patch, key_position). Rows in q's order; UsageError when the head is not of the
/// geometry's shape.
[[nodiscard]] DistanceRows attention_distance_units(const Variant& v, const MatF& q, const MatF& k,
                                                    double scale, const LayerGeometry& geo,
                                                    const PatchGeometry& root,
                                                    const DistanceOptions& opt);
/// What rows uniform over each query's allowed keys give on a layer of any geometry, averaged over
/// the grid queries (with renormalise: uniform over the allowed grid keys): the layer's baseline.
[[nodiscard]] double uniform_distance_units(const LayerGeometry& geo, const PatchGeometry& root,
                                            bool renormalise);

/// Quantities "distance", "grid_mass"; counters "degenerate_rows", "negative_weight_rows",
/// "rows_without_grid_mass"; `bins` bins over [0, max_distance].
[[nodiscard]] QueryStatsLayout distance_layout(const PatchGeometry& geometry, int bins);
/// The per-head measure of query_stats_images (fast path, or the reference); `scale`: the dump's
/// (a head's layer geometry has its own). Layers that distance_by_units names go through
/// attention_distance_units, with or without `reference`.
[[nodiscard]] HeadMeasureFn distance_measure(const PatchGeometry& geometry,
                                             const DistanceOptions& opt, double scale,
                                             bool reference);

}  // namespace attnscope::analyses
