// An image's part of a per-query statistics run (query_stats.hpp) as an image run's record, and
// back, exactly (numeric columns as byte strings, run/record_arrays.hpp: every double comes back
// bit for bit), and the per-layer image run of the commands. Shared by `distance`, `entropy` and
// `rank`; their result files are run/query_stats_files.hpp's, shared with the Python module.
#pragma once

#include "common.hpp"
#include "attnscope/run/image_run.hpp"
#include "selection_flags.hpp"
#include "stats_record.hpp"

#include "attnscope/analyses/query_stats.hpp"
#include "attnscope/run/query_stats_files.hpp"
#include "attnscope/error.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace attnscope::app {

/// Per variant: one StatsColumns per quantity (prefix "<quantity>_"), the histogram and the
/// counters, one row per head slot.
inline nlohmann::json query_stats_record(const analyses::QueryStatsLayout& layout,
                                         const analyses::QueryStatsImage& img) {
  nlohmann::json r = nlohmann::json::array();
  for (const auto& cells : img.cells) {
    nlohmann::json v = nlohmann::json::object();
    for (std::size_t q = 0; q < layout.quantities.size(); ++q) {
      StatsColumns col;
      for (const auto& c : cells) col.push(c.queries[q]);
      col.write(v, layout.quantities[q] + "_");
    }
    std::vector<std::vector<std::int64_t>> hist, counters;
    for (const auto& c : cells) {
      hist.push_back(c.histogram);
      counters.push_back(c.counters);
    }
    v["histogram"] = run::packed_rows(hist);
    v["counters"] = run::packed_rows(counters);
    r.push_back(std::move(v));
  }
  return r;
}

/// The inverse of query_stats_record; `empty` is the image's cells, labelled and sized
/// (analyses::labelled_cells). Error naming the command and image on a malformed record.
inline analyses::QueryStatsImage query_stats_from_record(
    const std::string& command, const analyses::QueryStatsLayout& layout,
    std::vector<std::vector<analyses::QueryStatsCell>> empty, int image, const nlohmann::json& r) {
  const std::string what = command + ": image " + std::to_string(image);
  if (!r.is_array() || r.size() != empty.size()) throw Error(what + ": a malformed record");
  analyses::QueryStatsImage img;
  img.image = image;
  for (std::size_t vi = 0; vi < empty.size(); ++vi) {
    auto& cells = empty[vi];
    const nlohmann::json& v = r[vi];
    for (std::size_t q = 0; q < layout.quantities.size(); ++q) {
      const StatsColumns col =
          StatsColumns::read(v, layout.quantities[q] + "_", cells.size(), what);
      for (std::size_t s = 0; s < cells.size(); ++s) cells[s].queries[q] = col.at(s);
    }
    const auto hist = run::unpacked_int64_rows(v.at("histogram"), what);
    const auto counters = run::unpacked_int64_rows(v.at("counters"), what);
    if (hist.size() != cells.size() || counters.size() != cells.size())
      throw Error(what + ": a malformed record");
    for (std::size_t s = 0; s < cells.size(); ++s) {
      if (hist[s].size() != layout.bins.slots() || counters[s].size() != layout.counters.size()) {
        throw Error(what + ": a malformed record");
      }
      cells[s].histogram = hist[s];
      cells[s].counters = counters[s];
    }
  }
  img.cells = std::move(empty);
  return img;
}

/// The image run of a per-query statistics analysis: computes this process's pending images
/// (each journaled as query_stats_record), then, in the process that writes the results, folds
/// every record of the selection in order and calls publish(result). Returns run.finish's answer
/// (false: this process prints nothing more); `totals` keeps the folded result for the summary.
inline bool run_query_stats(const std::string& command, ImageRun& run, DumpReader& reader,
                            const analyses::Selection& sel, const std::vector<Variant>& variants,
                            const analyses::QueryStatsLayout& layout,
                            const analyses::HeadMeasureFn& measure, ImageTimer& timer,
                            analyses::QueryStatsTotals& totals,
                            const std::function<void(analyses::QueryStatsResult&)>& publish,
                            bool need_v = false, bool need_model_tensors = false) {
  run.compute([&] {
    analyses::Selection part = sel;
    part.images = run.pending();
    Progress progress(command, part.images.size());
    analyses::query_stats_images(
        reader, part, variants, layout, measure,
        [&](analyses::QueryStatsImage&& img) {
          run.record(img.image, query_stats_record(layout, img));
          timer.tick();
          progress.tick();
        },
        need_v, need_model_tensors);
    progress.finish();
  });
  const auto empty = analyses::labelled_cells(variants.size(), sel, layout);
  auto apply = [&](int image, const nlohmann::json& rec) {
    totals.add(query_stats_from_record(command, layout, empty, image, rec));
  };
  return run.finish(apply, [&] { publish(totals.result()); });
}

}  // namespace attnscope::app
