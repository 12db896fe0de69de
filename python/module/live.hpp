// Analyses fed batch by batch: each batch brings every analysed layer's heads of a few images
// ([images, heads, tokens, dim] per layer, the images in order), and only the analysis's running
// totals are kept, folded image by image in order with the library's own totals (the same code
// the command folds a dump's images with). Memory does not grow with the number of images.
// attnscope.analyze runs a model through them; the one-shot functions (locality, census) are one
// batch of one layer. publish() writes the command's result files (result_files.hpp) into the
// results folder given at the start, as a result set whose manifest is the given run record;
// files that grow image by image (confusion's per-image files) are written as the images come.
#pragma once

#include "arrays.hpp"

#include "attnscope/analyses/census.hpp"
#include "attnscope/analyses/confusion.hpp"
#include "attnscope/analyses/locality.hpp"
#include "attnscope/analyses/query_stats.hpp"
#include "attnscope/run/result_files.hpp"
#include "attnscope/run/result_set.hpp"
#include "attnscope/variant.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace attnscope::python {

/// What every live analysis is told first: its variants, the model's index of each analysed layer
/// (the layers results report), heads per layer, the model's scale and token grid.
struct LiveSetup {
  std::vector<Variant> variants;
  std::vector<int> model_layers;
  int heads = 0;
  double scale = 1.0;
  TokenGrid grid;
};

/// One batch: q and k of every analysed layer, in the order of model_layers; v and the model's
/// own attention output `out` the same where the analysis reads them (empty otherwise).
struct LiveBatch {
  std::vector<Heads<float>> q, k, v, out;
};

class LiveAnalysis {
 public:
  virtual ~LiveAnalysis() = default;
  virtual void add(const LiveBatch& b) = 0;
  /// Whether add() needs the batch's v (UsageError when a batch lacks them).
  [[nodiscard]] virtual bool needs_v() const { return false; }
  /// Writes the result files into the results folder and publishes them with `record` as the
  /// manifest (its "results" gets the analysis's summary); returns the manifest's path.
  virtual std::string publish(nlohmann::json record) = 0;
  [[nodiscard]] std::int64_t images() const { return images_; }

 protected:
  /// Checks a batch against the setup (layers, heads, tokens; v and out, where given, against
  /// q's images, heads and tokens): UsageError naming what differs.
  void check_batch(const LiveSetup& s, const LiveBatch& b) const;
  /// The results folder, created when missing (UsageError when none was given).
  [[nodiscard]] std::filesystem::path results_folder() const;
  std::string out_dir_;  ///< empty: the totals are only read, never published
  std::int64_t images_ = 0;
};

class LiveLocality : public LiveAnalysis {
 public:
  LiveLocality(LiveSetup setup, int window, std::string out_dir = {});
  void add(const LiveBatch& b) override;
  std::string publish(nlohmann::json record) override;
  /// The totals, layers labelled with the model's indices.
  [[nodiscard]] analyses::LocalityResult result() const;

 private:
  LiveSetup setup_;
  int window_;
  analyses::LocalityTotals totals_;
};

class LiveCensus : public LiveAnalysis {
 public:
  LiveCensus(LiveSetup setup, double sum_tolerance, std::string out_dir = {});
  void add(const LiveBatch& b) override;
  std::string publish(nlohmann::json record) override;
  /// The cells (variant, then layer, then head), layers labelled with the model's indices.
  [[nodiscard]] std::vector<analyses::CensusCell> cells() const;

 private:
  LiveSetup setup_;
  analyses::CensusCollector collector_;
};

/// Confusion counts; the per-image files are written into the result set's staging folder as
/// images are added, so nothing grows in memory with the images.
class LiveConfusion : public LiveAnalysis {
 public:
  LiveConfusion(LiveSetup setup, analyses::ConfusionOptions opt, std::string out_dir);
  void add(const LiveBatch& b) override;
  std::string publish(nlohmann::json record) override;

 private:
  LiveSetup setup_;
  analyses::ConfusionOptions opt_;
  analyses::ConfusionTotals totals_;
  std::unique_ptr<run::ResultSet> set_;
  std::unique_ptr<run::ConfusionFiles> files_;
};

/// The per-query diagnostics (query_stats.hpp): "entropy" (log_eps, bins), "distance" (patch_size
/// in pixels, renormalise, bins) and "rank" (rank_tol; reads v, and the model's out where a batch
/// brings it, for the rank-collapse residual). Each image's values are folded as the command folds
/// a dump's image (fold_head per head, QueryStatsTotals over images in order).
class LiveQueryStats : public LiveAnalysis {
 public:
  LiveQueryStats(LiveSetup setup, std::string analysis, const pybind11::dict& options,
                 std::string out_dir = {});
  void add(const LiveBatch& b) override;
  std::string publish(nlohmann::json record) override;
  [[nodiscard]] bool needs_v() const override { return need_v_; }
  /// The totals, layers labelled with the model's indices.
  [[nodiscard]] analyses::QueryStatsResult result() const;

 private:
  LiveSetup setup_;
  std::string analysis_;
  analyses::QueryStatsLayout layout_;
  analyses::HeadMeasureFn measure_;
  analyses::QueryStatsTotals totals_;
  double patch_ = 1.0;
  bool renormalise_ = false;
  bool need_v_ = false;
};

}  // namespace attnscope::python
