// Per-query statistics of attention heads over a dump's images: the shape that `distance` and
// `entropy` share. An analysis measures, for one head of one image, a value per query for each of
// its quantities (NaN where the query has none: a prefix token it leaves out, a degenerate row)
// and a few counters; this driver streams the dump, keeps one image's part per (variant, layer,
// head) and folds the parts over images:
//   - per quantity, the statistics of every (image, query) value (RunningStats) and the
//     statistics of the images' means (each image's mean over its queries: "averaged over
//     queries, then images", as the ViT papers average attention distance);
//   - a histogram of quantity 0's values, equal-width bins over [lo, hi] plus one bin below and
//     one above (signed InLine/MALA weights can put a value outside the natural range);
//   - the counters, summed.
#pragma once

#include "attnscope/analyses/dump_loop.hpp"
#include "attnscope/analyses/locality.hpp"  // RunningStats
#include "attnscope/variant.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace attnscope::analyses {

/// Equal-width bins over [lo, hi] and one bin on either side. Counts are indexed 0 (below lo),
/// 1..bins (the bins; hi itself falls in the last), bins + 1 (above hi). With hi == lo every
/// value equal to lo falls in bin 1.
struct HistogramBins {
  double lo = 0.0;
  double hi = 1.0;
  int bins = 1;

  /// The count index of x (x not NaN).
  [[nodiscard]] std::size_t index(double x) const;
  /// Lower edge of bin b, 0 <= b <= bins (edge(bins) == hi).
  [[nodiscard]] double edge(int b) const;
  /// bins + 2.
  [[nodiscard]] std::size_t slots() const { return static_cast<std::size_t>(bins) + 2; }
};

/// What an analysis measures: the names of its quantities (quantity 0 has the histogram) and of
/// its counters, and the histogram's bins.
struct QueryStatsLayout {
  std::vector<std::string> quantities;
  std::vector<std::string> counters;
  HistogramBins bins;
};

/// One head of one image as an analysis measures it.
struct HeadQueryValues {
  std::vector<std::vector<double>> values;  ///< [quantity][query]; NaN: no value
  std::vector<std::int64_t> counters;       ///< [counter]
};

/// One (variant, layer, head): one image's part, or the total over images.
struct QueryStatsCell {
  int layer = 0;  ///< the dump's layer index (the apps report the model's)
  int head = 0;
  std::vector<RunningStats> queries;    ///< [quantity] every (image, query) value
  std::vector<RunningStats> images;     ///< [quantity] the images' means (totals only)
  std::vector<std::int64_t> histogram;  ///< quantity 0's values, HistogramBins::slots() counts
  std::vector<std::int64_t> counters;   ///< [counter]
};

/// One image's part of every (variant, slot), slot = layer slot * heads + head slot.
struct QueryStatsImage {
  int image = 0;
  std::vector<std::vector<QueryStatsCell>> cells;  ///< [variant][slot]
};

struct QueryStatsResult {
  std::vector<Variant> variants;
  QueryStatsLayout layout;
  std::vector<std::vector<QueryStatsCell>> cells;  ///< [variant][slot]
  std::int64_t images = 0;
  /// With each layer's own variant (Selection::own_variants): its name by the (model) layer the
  /// cells report; rows then name each layer's (row_variant_name). Empty otherwise.
  std::map<int, std::string> layer_variant_names;
};

/// Measures one head (q after the selection's transform) under one variant. Called on many
/// threads at once: it must be thread-safe.
using HeadMeasureFn = std::function<HeadQueryValues(const Variant& v, const HeadView& head)>;

/// Empty cells labelled with their layer and head, sized for `layout`, [variant][slot].
std::vector<std::vector<QueryStatsCell>> labelled_cells(std::size_t variants,
                                                        const Selection& resolved,
                                                        const QueryStatsLayout& layout);

/// One head's values folded into an image's cell (statistics, histogram, counters). UsageError
/// (an analysis's bug) when the shapes do not match the layout.
void fold_head(const QueryStatsLayout& layout, const HeadQueryValues& values, QueryStatsCell& cell);

/// Streams the selection of a dump, measuring every (variant, head) with `measure` (inside
/// in_head: a NumericalError names image, layer and head) and calling `sink` after each image, in
/// the selection's order. An image's part depends on that image only. V is read only with
/// need_v, the model's own attn/out only with need_model_tensors (HeadView).
void query_stats_images(DumpReader& reader, const Selection& resolved,
                        const std::vector<Variant>& variants, const QueryStatsLayout& layout,
                        const HeadMeasureFn& measure,
                        const std::function<void(QueryStatsImage&&)>& sink, bool need_v = false,
                        bool need_model_tensors = false);

/// Folds images' parts into a QueryStatsResult. Statistics are merged pairwise in the order the
/// images are add()ed (floating-point merges do not commute bit for bit): add them in the
/// selection's order and the result is the same to the last bit however the images were split.
class QueryStatsTotals {
 public:
  QueryStatsTotals(const std::vector<Variant>& variants, const Selection& resolved,
                   QueryStatsLayout layout);
  void add(const QueryStatsImage& img);
  [[nodiscard]] const QueryStatsResult& result() const { return res_; }
  [[nodiscard]] QueryStatsResult& result() { return res_; }
  /// Values of quantity 0 over everything (the rows measured; 0: nothing to report).
  [[nodiscard]] std::int64_t measured() const;

 private:
  QueryStatsResult res_;
};

}  // namespace attnscope::analyses
