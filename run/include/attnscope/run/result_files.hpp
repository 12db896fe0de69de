// The result files of the analyses that both the command and the Python module's live analysis
// (python/attnscope: analyze) write: the same bytes from the same results, whoever computed them.
#pragma once

#include "attnscope/run/result_set.hpp"

#include "attnscope/analyses/census.hpp"
#include "attnscope/analyses/confusion.hpp"
#include "attnscope/analyses/locality.hpp"
#include "attnscope/variant.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <map>
#include <string>
#include <vector>

namespace attnscope::run {

/// locality.csv: one row per (variant, layer, head), layers as the rows carry them.
void write_locality_files(ResultSet& set, const analyses::LocalityResult& r,
                          const char* name = "locality.csv");

/// census.csv: one row per cell (variant, layer, head). Returns the per-variant totals over every
/// layer and head (layer and head -1), in the order of `variants`.
std::vector<analyses::CensusCell> write_census_files(
    ResultSet& set, const std::vector<Variant>& variants,
    const std::vector<analyses::CensusCell>& cells);
/// The totals as the run record's "totals" (most_negative null where no weight was seen).
nlohmann::json census_totals_json(const std::vector<analyses::CensusCell>& totals);

/// total / images (0 without images): a per-image mean of the confusion files and records.
double mean_per_image(std::int64_t total, std::int64_t images);

/// The files of a confusion run: confusion_per_image.csv and confusion_per_image_layer.csv (and
/// confusion_excluded_tokens.csv with a token filter) grow as images are added in order; finish()
/// closes them and writes the totals' files confusion_per_head.csv, confusion_per_layer.csv and
/// confusion_histogram.csv. `model_layers`: the model's index of each layer slot.
class ConfusionFiles {
 public:
  ConfusionFiles(ResultSet& set, std::vector<Variant> variants, std::vector<int> model_layers,
                 bool with_excluded_tokens);
  ~ConfusionFiles();
  ConfusionFiles(const ConfusionFiles&) = delete;
  ConfusionFiles& operator=(const ConfusionFiles&) = delete;
  /// One image, with its totals (ConfusionTotals::add's answer).
  void add_image(const analyses::ConfusionImage& img, const analyses::ConfusionImageTotals& t);
  /// `r`'s layers as results report them (the model's indices).
  void finish(const analyses::ConfusionResult& r);
  /// With each layer's own variant: its name by model layer, for the per-image rows.
  void set_layer_variant_names(std::map<int, std::string> names) {
    layer_variant_names_ = std::move(names);
  }

 private:
  ResultSet& set_;
  std::vector<Variant> variants_;
  std::vector<int> model_layers_;
  std::map<int, std::string> layer_variant_names_;
  std::unique_ptr<ResultFile> per_image_, per_image_layer_, excluded_;
};

}  // namespace attnscope::run
