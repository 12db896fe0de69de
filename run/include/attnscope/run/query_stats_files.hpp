// The result files of the per-query diagnostics (query_stats.hpp: entropy, distance, rank) that
// the command and the Python module's live analysis (python/attnscope: analyze) both write: the
// same bytes from the same totals, whoever computed them. Layers are written as the cells carry
// them (the model's indices).
#pragma once

#include "attnscope/run/result_set.hpp"

#include "attnscope/analyses/distance.hpp"
#include "attnscope/analyses/query_stats.hpp"

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

namespace attnscope::run {

/// Per layer: the mean over heads of each head's mean of quantity `q` over images (heads without
/// a value left out), with `scale` applied (e.g. 1 / log N).
std::map<int, double> layer_means(const std::vector<analyses::QueryStatsCell>& cells,
                                  std::size_t q, double scale = 1.0);

/// Writes `file`: the histogram of quantity 0, one row per (variant, layer, head, bin) with the
/// bin's label (below, 0..bins-1, above), lower and upper edge, and count; `count_column` names
/// the count ("queries", "images").
void write_histogram(ResultSet& set, const analyses::QueryStatsResult& r, const std::string& file,
                     const std::string& count_column);

/// entropy.csv and entropy_histogram.csv; mean_normalised is the mean of each row's H_i / log n_i
/// (n_i the keys the row sees: entropy.hpp).
void write_entropy_files(ResultSet& set, const analyses::QueryStatsResult& r);
/// The run record's results of entropy: "images", "log_n" (the dump's N; the histogram's range)
/// and per variant its per-layer means.
nlohmann::json entropy_results(const analyses::QueryStatsResult& r, double log_n);

/// distance.csv and distance_histogram.csv.
void write_distance_files(ResultSet& set, const analyses::QueryStatsResult& r);
/// The run record's results of distance: "images", "max_distance", "uniform_baseline" and per
/// variant its per-layer means and how its weights were taken (signed where the variant's, or
/// any of `own`'s, each layer's own variant on a hybrid dump, can be negative).
nlohmann::json distance_results(const analyses::QueryStatsResult& r,
                                const analyses::PatchGeometry& geometry, bool renormalise,
                                const std::vector<Variant>& own = {});

/// rank.csv and rank_histogram.csv.
void write_rank_files(ResultSet& set, const analyses::QueryStatsResult& r);
/// The run record's results of rank: "images" and per variant its per-layer means.
nlohmann::json rank_results(const analyses::QueryStatsResult& r);
/// The rows of a rank run that are not degenerate (a W of zero rows measures nothing).
std::int64_t rank_measured_rows(const analyses::QueryStatsResult& r, int tokens);

}  // namespace attnscope::run
