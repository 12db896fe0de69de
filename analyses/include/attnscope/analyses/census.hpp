// Weight census: per layer and head of a dump, how many InLine / MALA weights are negative or
// zero, the smallest weight, and how many rows fail to sum to 1. The MALA paper states that
// negative weights never occurred in its models; this makes the claim testable on any dump.
//
// Weights are computed in double from the dump's (float) Q and K with the variant's formula and
// convention. Rows the library reports as degenerate (a zero normaliser) are left out of every
// count and counted on their own.
//
// Layers of another geometry (geometry.hpp) are counted unit by unit: each window's N_w x N_w
// weights (the shifted-window mask applied: only the pairs the mask allows are weights, so a
// forbidden pair is neither counted nor a zero) or the N x M weights against the reduced keys;
// `weights` is then the number of allowed pairs, not rows x N.
#pragma once

#include "attnscope/analyses/dump_loop.hpp"
#include "attnscope/device.hpp"
#include "attnscope/dump.hpp"
#include "attnscope/geometry.hpp"
#include "attnscope/layout.hpp"
#include "attnscope/variant.hpp"

#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

namespace attnscope::analyses {

/// Default tolerance on |sum_j w_ij - 1| (the target sum is 1, so absolute = relative).
inline constexpr double kDefaultSumTolerance = 1e-6;

struct CensusCell {
  std::string variant;
  int layer = 0;
  int head = 0;
  long long rows = 0;      ///< rows counted (all images)
  long long weights = 0;   ///< weights counted = rows x N
  long long negative = 0;  ///< w < 0
  long long zero = 0;      ///< w == 0 exactly
  /// The smallest weight seen (positive when none is negative; +inf before any row).
  double most_negative = std::numeric_limits<double>::infinity();
  long long rows_not_summing_to_one = 0;  ///< |sum_j w_ij - 1| > tolerance
  double max_row_sum_error = 0.0;         ///< max |sum_j w_ij - 1|
  long long degenerate_rows = 0;          ///< left out of the counts above

  /// Folds another cell of the same variant, layer and head.
  void merge(const CensusCell& other);
};

/// Cells as columns: one vector per count, in the cells' order (a result record, a table).
struct CensusColumns {
  std::vector<long long> rows, weights, negative, zero, rows_not_summing_to_one, degenerate_rows;
  std::vector<double> most_negative, max_row_sum_error;
};
[[nodiscard]] CensusColumns census_columns(const std::vector<CensusCell>& cells);

/// The census of one head's weight matrix w (rows = queries). `degenerate` lists rows to skip
/// (sorted). With a mask (w's shape, true = kept) only the kept entries are weights.
[[nodiscard]] CensusCell census_of(const MatD& w, const std::vector<int>& degenerate,
                                   double sum_tolerance, const Mask* mask = nullptr);
/// The census of a head of any layer geometry, unit by unit (each window with its mask, or the
/// queries against the reduced keys), the units' counts merged. The weights in double through
/// the registry (geometry_heads.hpp's unit_rows), on the CPU.
[[nodiscard]] CensusCell census_units(const Variant& v, const MatF& q, const MatF& k, double scale,
                                      const LayerGeometry& geo, double sum_tolerance);

/// The families counted by default: inline and mala; where the dump's own model is of one of
/// them, its own variant (map and convention); otherwise the family's default map under the dump's
/// convention. Throws UsageError when a variant cannot be computed (code+rope), saying why.
[[nodiscard]] std::vector<Variant> default_census_variants(const DumpAttributes& attrs);

/// Collects the census of every (variant, layer, head) of a selection as heads arrive.
/// add_head() is thread-safe.
class CensusCollector {
 public:
  CensusCollector(std::vector<Variant> variants, const Selection& resolved, double scale,
                  double sum_tolerance);
  void add_head(const HeadView& head);
  /// Cuda: each head's weights are computed on the GPU (gpu/attention.hpp), in double like the
  /// CPU's; a weight within rounding of 0 or a row sum within rounding of the tolerance can then
  /// be counted differently.
  /// Heads of a layer that is not one square attention are counted on the CPU (census_units).
  void set_device(Device device) { device_ = device; }
  /// Cells ordered by variant, then layer, then head.
  [[nodiscard]] std::vector<CensusCell> cells() const;
  /// The cells, after which every count starts again from zero (labels kept): called after each
  /// image, one image's census.
  [[nodiscard]] std::vector<CensusCell> take();
  /// Folds cells ordered like cells() (another collector's take(), e.g. one image's census).
  /// Every count is a sum, a minimum or a maximum, so the result does not depend on how the
  /// images were split or in which order they are added.
  void add(const std::vector<CensusCell>& part);

 private:
  [[nodiscard]] std::size_t slot(std::size_t variant, int layer, int head) const;

  Device device_ = Device::Cpu;

  std::vector<Variant> variants_;
  std::vector<int> layers_, heads_;
  double scale_;
  double tolerance_;
  std::vector<CensusCell> cells_;
  mutable std::mutex mutex_;
};

/// Streams the selection of a dump through a collector of these variants, handing each image's
/// census (cells ordered like CensusCollector::cells()) to `sink`, in the selection's order.
void census_images(DumpReader& reader, const Selection& resolved, const std::vector<Variant>& variants,
                   double scale, double sum_tolerance,
                   const std::function<void(int image, std::vector<CensusCell>&&)>& sink,
                   Device device = Device::Cpu);

}  // namespace attnscope::analyses
