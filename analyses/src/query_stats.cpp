// Streaming driver of the per-query statistics (query_stats.hpp): one image's part per (variant,
// layer, head), folded over images in order; memory independent of the number of images.
#include "attnscope/analyses/query_stats.hpp"

#include "attnscope/analyses/head_error.hpp"
#include "attnscope/error.hpp"

#include <algorithm>
#include <cmath>

namespace attnscope::analyses {

std::size_t HistogramBins::index(double x) const {
  if (x < lo) return 0;
  if (x > hi) return static_cast<std::size_t>(bins) + 1;
  if (!(hi > lo)) return 1;
  const double t = (x - lo) / (hi - lo) * static_cast<double>(bins);
  const int b = std::min(bins - 1, static_cast<int>(t));
  return static_cast<std::size_t>(b) + 1;
}

double HistogramBins::edge(int b) const {
  if (b >= bins) return hi;
  return lo + (hi - lo) * static_cast<double>(b) / static_cast<double>(bins);
}

std::vector<std::vector<QueryStatsCell>> labelled_cells(std::size_t variants,
                                                        const Selection& resolved,
                                                        const QueryStatsLayout& layout) {
  const std::size_t nh = resolved.heads.size();
  QueryStatsCell empty;
  empty.queries.assign(layout.quantities.size(), RunningStats{});
  empty.images.assign(layout.quantities.size(), RunningStats{});
  empty.histogram.assign(layout.bins.slots(), 0);
  empty.counters.assign(layout.counters.size(), 0);
  std::vector<std::vector<QueryStatsCell>> out(
      variants, std::vector<QueryStatsCell>(resolved.layers.size() * nh, empty));
  for (auto& cells : out) {
    for (std::size_t s = 0; s < cells.size(); ++s) {
      cells[s].layer = resolved.layers[s / nh];
      cells[s].head = resolved.heads[s % nh];
    }
  }
  return out;
}

void fold_head(const QueryStatsLayout& layout, const HeadQueryValues& values,
               QueryStatsCell& cell) {
  if (values.values.size() != layout.quantities.size() ||
      values.counters.size() != layout.counters.size()) {
    throw UsageError("query statistics: a head's values do not match the analysis's layout");
  }
  // Each quantity's values are added to its own RunningStats in their order (so the bits are
  // those of one quantity after the other); the quantities are taken side by side, value t of
  // each in turn, so that their chains of dependent divisions overlap.
  std::size_t longest = 0;
  for (const std::vector<double>& v : values.values) longest = std::max(longest, v.size());
  for (std::size_t t = 0; t < longest; ++t) {
    for (std::size_t q = 0; q < values.values.size(); ++q) {
      const std::vector<double>& v = values.values[q];
      if (t >= v.size() || std::isnan(v[t])) continue;
      cell.queries[q].add(v[t]);
      if (q == 0) ++cell.histogram[layout.bins.index(v[t])];
    }
  }
  for (std::size_t c = 0; c < values.counters.size(); ++c) cell.counters[c] += values.counters[c];
}

void query_stats_images(DumpReader& reader, const Selection& resolved,
                        const std::vector<Variant>& variants, const QueryStatsLayout& layout,
                        const HeadMeasureFn& measure,
                        const std::function<void(QueryStatsImage&&)>& sink, bool need_v,
                        bool need_model_tensors) {
  const DumpSchema& schema = reader.schema();
  const std::size_t nh = resolved.heads.size();
  std::vector<int> layer_slot(static_cast<std::size_t>(schema.attrs.num_layers), -1);
  std::vector<int> head_slot(static_cast<std::size_t>(schema.max_heads()), -1);
  for (std::size_t s = 0; s < resolved.layers.size(); ++s)
    layer_slot[resolved.layers[s]] = static_cast<int>(s);
  for (std::size_t s = 0; s < nh; ++s) head_slot[resolved.heads[s]] = static_cast<int>(s);

  const std::vector<std::vector<QueryStatsCell>> empty =
      labelled_cells(variants.size(), resolved, layout);
  // Each image in flight has its lane's cells; each (layer, head) slot of them is written by one
  // thread, so the slots need no lock.
  std::vector<QueryStatsImage> current(kImagesInFlight);
  for (QueryStatsImage& c : current) c.cells = empty;
  auto on_head = [&](const HeadView& hv, std::size_t lane) {
    const std::size_t s = static_cast<std::size_t>(layer_slot[hv.layer]) * nh +
                          static_cast<std::size_t>(head_slot[hv.head]);
    for (std::size_t vi = 0; vi < variants.size(); ++vi) {
      const HeadQueryValues values = in_head(
          hv.image, hv.layer, hv.head, [&] { return measure(head_variant(variants, vi, hv), hv); });
      fold_head(layout, values, current[lane].cells[vi][s]);
    }
  };
  auto on_image = [&](int image, std::size_t lane) {
    QueryStatsImage done;
    done.image = image;
    done.cells = std::move(current[lane].cells);
    current[lane].cells = empty;
    sink(std::move(done));
  };
  Selection sel = resolved;
  sel.need_v = need_v;
  sel.need_model_tensors = need_model_tensors;
  for_each_head_pipelined(reader, sel, kImagesInFlight, on_head, on_image);
}

QueryStatsTotals::QueryStatsTotals(const std::vector<Variant>& variants, const Selection& resolved,
                                   QueryStatsLayout layout) {
  res_.variants = variants;
  res_.cells = labelled_cells(variants.size(), resolved, layout);
  res_.layout = std::move(layout);
}

void QueryStatsTotals::add(const QueryStatsImage& img) {
  const std::string what = "image " + std::to_string(img.image) + "'s part";
  if (img.cells.size() != res_.cells.size()) throw Error(what + " does not match the variants");
  for (std::size_t vi = 0; vi < img.cells.size(); ++vi) {
    if (img.cells[vi].size() != res_.cells[vi].size())
      throw Error(what + " does not match the selection's heads");
    for (std::size_t s = 0; s < img.cells[vi].size(); ++s) {
      const QueryStatsCell& part = img.cells[vi][s];
      QueryStatsCell& total = res_.cells[vi][s];
      if (part.queries.size() != total.queries.size() ||
          part.histogram.size() != total.histogram.size() ||
          part.counters.size() != total.counters.size()) {
        throw Error(what + " does not match the analysis's layout");
      }
      for (std::size_t q = 0; q < part.queries.size(); ++q) {
        total.queries[q].merge(part.queries[q]);
        if (part.queries[q].count > 0) total.images[q].add(part.queries[q].mean);
      }
      for (std::size_t b = 0; b < part.histogram.size(); ++b)
        total.histogram[b] += part.histogram[b];
      for (std::size_t c = 0; c < part.counters.size(); ++c) total.counters[c] += part.counters[c];
    }
  }
  ++res_.images;
}

std::int64_t QueryStatsTotals::measured() const {
  std::int64_t n = 0;
  for (const auto& cells : res_.cells) {
    for (const auto& c : cells) n += c.queries.empty() ? 0 : c.queries[0].count;
  }
  return n;
}

}  // namespace attnscope::analyses
