// Recomputation check: attention outputs (and weights) recomputed by the library from a dump's
// q, k, v against the model's own tensors that the dumper captured (/layers/L/out, /layers/L/attn).
// This is how a user learns that attnscope computes exactly what their model computed.
#pragma once

#include "attnscope/analyses/dump_loop.hpp"
#include "attnscope/dump.hpp"
#include "attnscope/layout.hpp"
#include "attnscope/variant.hpp"

#include <functional>
#include <string>
#include <vector>

namespace attnscope::analyses {

/// Error of one (layer, head) accumulated over images. Relative errors are divided by the largest
/// |value| of the model's tensor for that image and head (a scale-free measure that does not blow
/// up on entries near zero).
struct RecomputeCell {
  int layer = 0;
  int head = 0;
  long long images = 0;
  bool has_out = false, has_attn = false;
  double out_max_abs = 0.0, out_max_rel = 0.0, out_sum_abs = 0.0;
  long long out_values = 0;
  double attn_max_abs = 0.0;
  long long degenerate_rows = 0;

  [[nodiscard]] double out_mean_abs() const {
    return out_values ? out_sum_abs / static_cast<double>(out_values) : 0.0;
  }
  /// Adds another image's (or run's) errors of the same head: maxima, counts and the sum. The
  /// sum is of doubles: merge images in the selection's order for the same bits every time.
  void merge(const RecomputeCell& other);
};

/// Compares one head: `out_model` (N x d) and/or `attn_model` (N x N) may be null.
/// The library's outputs are computed in double with the variant's linear-time form where it has
/// one (the fast path), the weights explicitly. With a `geometry` of windows or reduced keys
/// (geometry.hpp), each unit is computed apart (windows with their masks, the masked ones through
/// the explicit weights) and compared with its rows of the model's tensors.
void compare_head(const Variant& variant, const MatF& q, const MatF& k, const MatF& v,
                  double scale, const MatF* out_model, const MatF* attn_model, RecomputeCell& cell,
                  const LayerGeometry* geometry = nullptr);

/// Streams the given images of a dump (empty = all) through for_each_head (dump_loop.hpp), the
/// model's tensors read with their image, and returns one cell per (layer, head). Throws
/// InputError when the dump has neither `out` nor `attn` in any layer, UsageError on an image
/// index out of range.
/// One image's errors: one cell per (layer, head), layer-major, each with images == 1.
struct RecomputeImage {
  int image = 0;
  std::vector<RecomputeCell> cells;
};

/// Streams the given images of a dump (empty = all), in order, calling `sink` after each image.
/// Of `streaming`, only the loop's memory budget and statistics (max_memory, stats) are used:
/// every layer and head is compared. Throws as recompute_dump does.
void recompute_images(DumpReader& reader, const Variant& variant, const std::vector<int>& images,
                      const std::function<void(RecomputeImage&&)>& sink,
                      const Selection& streaming = {});
/// The same with one variant per dump layer (`per_layer[L]` for /layers/L, e.g. each layer's own
/// DumpSchema::layer_variant in a dump whose layers differ in family). UsageError when the count
/// is not the dump's number of layers.
void recompute_images(DumpReader& reader, const std::vector<Variant>& per_layer,
                      const std::vector<int>& images,
                      const std::function<void(RecomputeImage&&)>& sink,
                      const Selection& streaming = {});

/// Empty cells, one per (layer, head) of the dump (each layer its own heads), layer-major (the
/// order of RecomputeImage).
[[nodiscard]] std::vector<RecomputeCell> recompute_cells(const DumpSchema& schema);

/// recompute_images merged image by image, in order, into recompute_cells.
[[nodiscard]] std::vector<RecomputeCell> recompute_dump(DumpReader& reader, const Variant& variant,
                                                        const std::vector<int>& images);

}  // namespace attnscope::analyses
