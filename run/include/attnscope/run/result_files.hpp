// The result files of the analyses that both the command and the Python module's live analysis
// (python/attnscope: analyze) write: the same bytes from the same results, whoever computed them.
#pragma once

#include "attnscope/run/result_set.hpp"

#include "attnscope/analyses/census.hpp"
#include "attnscope/analyses/locality.hpp"
#include "attnscope/variant.hpp"

#include <nlohmann/json.hpp>

#include <vector>

namespace attnscope::run {

/// locality.csv: one row per (variant, layer, head), layers as the rows carry them.
void write_locality_files(ResultSet& set, const analyses::LocalityResult& r);

/// census.csv: one row per cell (variant, layer, head). Returns the per-variant totals over every
/// layer and head (layer and head -1), in the order of `variants`.
std::vector<analyses::CensusCell> write_census_files(
    ResultSet& set, const std::vector<Variant>& variants,
    const std::vector<analyses::CensusCell>& cells);
/// The totals as the run record's "totals" (most_negative null where no weight was seen).
nlohmann::json census_totals_json(const std::vector<analyses::CensusCell>& totals);

}  // namespace attnscope::run
