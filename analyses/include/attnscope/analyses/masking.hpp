// Masking, the layer-local view (InLine Table 2 without the rest of the network): per image,
// layer, head and family, remove each grid query's local k x k window ("local:k", the query's own
// token included) or n random keys outside its 3 x 3 window ("random:n", seeded; the same draw for
// every family), renormalise over the kept keys as each family defines it (attention.hpp, Mask),
// and measure how far the attention output moves and how much weight was removed.
//
//   change        |O' - O|_F / |O|_F over the head's rows (one value per image and head); rows the
//                 family leaves degenerate without the mask, and rows the mask leaves with no key,
//                 are left out of both norms and counted
//   removed mass  per grid query, the sum of its unmasked weights on the removed keys (signed:
//                 InLine and MALA weights can be negative)
//
// Prefix queries (CLS) keep every key; prefix keys are never removed.
//
// Layers of another geometry (geometry.hpp) are masked unit by unit (mask_units): in a window,
// "local:k" removes the window's keys whose cells lie in the query's k x k cells and "random:n"
// draws n of the keys the window's own mask allows outside the query's 3 x 3 cells; with reduced
// keys, the query's cell is mapped onto the key grid as locality maps it. The unmasked run is the
// layer's own attention (a shifted window's mask applied), the masked run that mask less the
// removed keys; the change is over every window's rows of the head together.
#pragma once

#include "attnscope/analyses/dump_loop.hpp"
#include "attnscope/analyses/locality.hpp"
#include "attnscope/attention.hpp"
#include "attnscope/device.hpp"
#include "attnscope/geometry.hpp"
#include "attnscope/layout.hpp"
#include "attnscope/variant.hpp"

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace attnscope::analyses {

struct MaskSpec {
  enum class Kind { Local, Random };
  Kind kind = Kind::Local;
  int size = 3;  ///< window side k (local) or number of keys n (random)
  /// "local:3", "random:9".
  [[nodiscard]] std::string name() const;
};

/// Comma-separated "local:K" (K odd, >= 1) and "random:N" (N >= 0) items. Throws UsageError
/// naming `flag` and the bad item; a mask named twice is refused.
[[nodiscard]] std::vector<MaskSpec> parse_mask_specs(std::string_view specs,
                                                     std::string_view flag = "--mask");

/// The default list: the windows and random counts of InLine Table 2.
inline constexpr std::string_view kDefaultMasks = "local:3,local:5,local:7,random:9,random:25,random:49";

/// The mask of one head (random masks drawn from `seed`).
[[nodiscard]] Mask build_mask(const MaskSpec& spec, const TokenGrid& grid, std::uint64_t seed);

/// The seed of the random draw of one (image, layer, head): the same for every family.
[[nodiscard]] std::uint64_t mask_seed(std::uint64_t seed, int image, int layer, int head);

struct MaskCell {
  std::string variant;
  std::string mask;
  int layer = 0;
  int head = 0;
  RunningStats change;        ///< one value per image
  RunningStats removed_mass;  ///< one value per grid query kept in the comparison
  long long empty_rows = 0;       ///< rows the mask leaves with no key (left out)
  long long degenerate_rows = 0;  ///< rows degenerate without the mask (left out)
  long long unmeasured_heads = 0; ///< images where no row was left to compare (|O| = 0)

  void merge(const MaskCell& other);
};

/// One head, one variant, one mask: the cell's part from this head (change: one value).
/// `mask` must be q.rows() x k.rows().
[[nodiscard]] MaskCell mask_head(const Variant& v, const MatD& q, const MatD& k, const MatD& values,
                                 double scale, const Mask& mask);

/// mask_head with the weights and both outputs computed on the GPU (gpu/attention.hpp): the same
/// counts, the change and removed mass to rounding. UsageError in a build without CUDA.
[[nodiscard]] MaskCell mask_head_cuda(const Variant& v, const MatD& q, const MatD& k,
                                      const MatD& values, double scale, const Mask& mask);

/// mask_head's statistics from the weights w (no mask), the outputs o = w V and o_masked (under
/// the mask) and both runs' degenerate rows: shared by the CPU and GPU paths.
[[nodiscard]] MaskCell mask_statistics(const MatD& w, const MatD& o, const MatD& o_masked, const Diagnostics& plain,
                                       const Diagnostics& masked, const Mask& mask);

/// One head of any layer geometry (q: query_rows() x d, k and values: key_rows() rows), one
/// variant, one mask: each unit's rows without and with unit_removal_mask (geometry_heads.hpp;
/// random draws from mix_seed(seed, unit)), in double through the registry; the change over every
/// unit's rows together (one value). UsageError when the head is not of the geometry's shape.
[[nodiscard]] MaskCell mask_units(const Variant& v, const MatF& q, const MatF& k,
                                  const MatF& values, double scale, const LayerGeometry& geo,
                                  const MaskSpec& spec, std::uint64_t seed);

/// Collects cells over a dump, one per (variant, mask, layer, head), in that order.
class MaskCollector {
 public:
  MaskCollector(std::vector<Variant> variants, std::vector<MaskSpec> masks, const Selection& resolved,
                const TokenGrid& grid, double scale, std::uint64_t seed);
  void add_head(const HeadView& head);
  [[nodiscard]] std::vector<MaskCell> cells() const;
  /// The cells, after which every cell starts again empty (labels kept): called after each image,
  /// one image's cells.
  [[nodiscard]] std::vector<MaskCell> take();
  /// Folds cells ordered like cells() (another collector's take(), e.g. one image's cells).
  /// Statistics are merged pairwise (RunningStats::merge), which is not associative bit for bit:
  /// add the images in the selection's order, and the result is the same to the last bit however
  /// the images were split between processes.
  void add(const std::vector<MaskCell>& part);
  /// Cuda: each head's weights and outputs are computed on the GPU (mask_head_cuda); heads of a
  /// layer that is not one square attention go through mask_units on the CPU.
  void set_device(Device device) { device_ = device; }

 private:
  Device device_ = Device::Cpu;
  std::vector<Variant> variants_;
  std::vector<Variant> own_;  ///< each dump layer's own variant (Selection::own_variants), or empty
  std::vector<MaskSpec> masks_;
  std::vector<int> layers_, heads_;
  TokenGrid grid_;
  double scale_;
  std::uint64_t seed_;
  mutable std::mutex mutex_;
  std::vector<MaskCell> cells_;
};

/// Streams the selection of a dump through a collector of these variants and masks, handing each
/// image's cells (ordered like MaskCollector::cells()) to `sink`, in the selection's order. An
/// image's cells depend on that image only (random masks are drawn per image, mask_seed).
void mask_images(DumpReader& reader, const Selection& resolved, const std::vector<Variant>& variants,
                 const std::vector<MaskSpec>& masks, const TokenGrid& grid, double scale,
                 std::uint64_t seed, const std::function<void(int image, std::vector<MaskCell>&&)>& sink,
                 Device device = Device::Cpu);

}  // namespace attnscope::analyses
