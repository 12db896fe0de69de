// Local attention mass (InLine paper, Fig. 3): for each grid query, the attention that falls in
// its k x k grid window (itself included, clipped at the borders). Prefix tokens are neither
// queries nor neighbours. Degenerate rows (attention.hpp) are skipped and counted.
#pragma once

#include "attnscope/analyses/dump_loop.hpp"
#include "attnscope/device.hpp"
#include "attnscope/layout.hpp"
#include "attnscope/variant.hpp"

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace attnscope::analyses {

/// Count, mean, spread and range of a stream of values (Chan et al.'s merge of partial moments).
struct RunningStats {
  std::int64_t count = 0;
  double mean = 0.0;
  double m2 = 0.0;  ///< sum of squared deviations from the mean
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();

  void add(double x);
  void merge(const RunningStats& other);
  /// Population standard deviation (0 for fewer than two values).
  [[nodiscard]] double stddev() const;
};

/// Mass in each token's window, one entry per token; NaN for prefix tokens and degenerate rows.
/// `degenerate`, if given, receives the number of degenerate grid rows. q and k are read in place
/// (a MatF, or a view of a caller's row-major buffer with any row stride: the Python module's).
std::vector<double> local_mass(const Variant& v, Eigen::Ref<const MatF> q, Eigen::Ref<const MatF> k,
                               double scale, const TokenGrid& grid, int window,
                               int* degenerate = nullptr);
/// local_mass on the GPU (locality_cuda.cpp): double rows on the device, each query's window
/// summed there; within 1e-6 of local_mass. UsageError in a build without CUDA.
std::vector<double> local_mass_cuda(const Variant& v, const MatF& q, const MatF& k, double scale,
                                    const TokenGrid& grid, int window, int* degenerate = nullptr);
/// The same from the double rows of ExactRows, summed over a window found by scanning the grid.
std::vector<double> local_mass_reference(const Variant& v, const MatF& q, const MatF& k, double scale,
                                         const TokenGrid& grid, int window, int* degenerate = nullptr);

/// The statistics of one head's masses (local_mass's entries, in token order), NaN entries (prefix
/// tokens, degenerate rows) left out: one image's part of a LocalityHead.
[[nodiscard]] RunningStats mass_stats(const std::vector<double>& mass);

/// What a uniform row puts in the same windows: the mean over grid queries of |window| / N
/// (9/197 for an interior query of DeiT-T).
double uniform_baseline(const TokenGrid& grid, int window);

struct LocalityHead {
  int layer = 0;
  int head = 0;
  RunningStats mass;                 ///< over images and grid queries
  std::int64_t degenerate_rows = 0;  ///< summed over images
};

struct LocalityResult {
  std::vector<Variant> variants;
  std::vector<std::vector<LocalityHead>> per_head;  ///< [variant][slot*heads+h]
  int window = 3;
  double uniform_baseline = 0.0;
  std::int64_t images = 0;
  /// Layers of another geometry than the dump's (geometry_heads.hpp): their own uniform
  /// baselines, by the layer the rows report.
  std::map<int, double> layer_baselines;
  /// With each layer's own variant: its name by the layer the rows report (empty otherwise).
  std::map<int, std::string> layer_variant_names;
};

/// One image's part of every (variant, slot): its statistics over the image's grid queries, in
/// the layout of LocalityResult::per_head (layer and head filled).
struct LocalityImage {
  int image = 0;
  std::vector<std::vector<LocalityHead>> heads;  ///< [variant][slot*heads+h]
};

/// Streams the selection of a dump, calling `sink` after each image, in the selection's order.
/// An image's part depends on that image only, whoever computes it.
/// With device Cuda each head's mass is computed on the GPU (local_mass_cuda; `reference` wins).
void locality_images(DumpReader& reader, const Selection& resolved,
                     const std::vector<Variant>& variants, int window, bool reference,
                     const std::function<void(LocalityImage&&)>& sink, Device device = Device::Cpu);

/// Folds images' parts into a LocalityResult: per slot, the images' statistics merged pairwise
/// (RunningStats::merge) in the order they are add()ed. Floating-point merges do not commute
/// bit for bit, so add() the images in the selection's order: however the images were split
/// between processes, the result is then the same to the last bit.
class LocalityTotals {
 public:
  LocalityTotals(const std::vector<Variant>& variants, const Selection& resolved,
                 const TokenGrid& grid, int window);
  void add(const LocalityImage& img);
  [[nodiscard]] const LocalityResult& result() const { return res_; }
  [[nodiscard]] LocalityResult& result() { return res_; }

 private:
  LocalityResult res_;
};

/// Streams the selection of a dump and folds it (locality_images + LocalityTotals);
/// on_image(image) runs after each image (progress).
LocalityResult run_locality(DumpReader& reader, const Selection& resolved,
                            const std::vector<Variant>& variants, int window, bool reference = false,
                            const std::function<void(int)>& on_image = {}, Device device = Device::Cpu);

}  // namespace attnscope::analyses
