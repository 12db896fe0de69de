// Layer numbers as users see them: the model's own indices (a dump's `source_layers` attribute,
// DumpSchema::source_layers), not positions in the dump. --layers takes model indices and every
// CSV and JSON reports them; without source_layers the two are the same.
#pragma once

#include "attnscope/dump.hpp"
#include "attnscope/error.hpp"

#include <algorithm>
#include <string>
#include <vector>

namespace attnscope::app {

/// The dump positions of the model layers given to --layers. Without source_layers the indices
/// pass through unchanged (range errors are the selection's); with it, a model layer that the
/// dump does not hold is a UsageError naming the layers it does hold.
inline std::vector<int> dump_layers_of(const DumpSchema& s, const std::vector<int>& model) {
  if (s.source_layers.empty()) return model;
  std::vector<int> out;
  for (int m : model) {
    const int pos = s.dump_layer(m);
    if (pos < 0) {
      std::string held;
      for (int l : s.source_layers) held += (held.empty() ? "" : ",") + std::to_string(l);
      throw UsageError("--layers: model layer " + std::to_string(m) + " is not in " + s.path +
                       ", which holds model layers " + held + " (its source_layers)");
    }
    out.push_back(pos);
  }
  return out;
}

/// The model layer indices of dump positions.
inline std::vector<int> model_layers_of(const DumpSchema& s, const std::vector<int>& dump) {
  std::vector<int> out;
  for (int l : dump) out.push_back(s.model_layer(l));
  return out;
}

/// Drops the rows of heads a layer does not have (a dump whose layers differ in heads: the
/// selection's heads go up to the most of any layer). Call before report_model_layers: `layer`
/// is still the dump's.
template <class Rows>
void drop_missing_heads(Rows& rows, const DumpSchema& s) {
  rows.erase(std::remove_if(rows.begin(), rows.end(),
                            [&s](const auto& row) {
                              return row.layer >= 0 && row.head >= s.geometry(row.layer).num_heads;
                            }),
             rows.end());
}

/// Rewrites the `layer` of every result row from its dump position to the model's index (rows
/// with a negative layer, e.g. totals, are left alone).
template <class Rows>
void report_model_layers(Rows& rows, const DumpSchema& s) {
  for (auto& row : rows) {
    if (row.layer >= 0) row.layer = s.model_layer(row.layer);
  }
}

}  // namespace attnscope::app
