// Streaming over a dump: images are read on one thread (HDF5 is not thread-safe), heads are
// computed in parallel with OpenMP. Memory is bounded by a few images, whatever the dump's size.
#pragma once

#include "attnscope/dump.hpp"
#include "attnscope/variant.hpp"
#include "attnscope/query_transform.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace attnscope::analyses {

/// What one streaming loop measured (for_each_head adds to it).
struct LoopStats {
  double io_wait_seconds = 0;  ///< time the computing side waited for the reader
  double loop_seconds = 0;     ///< wall time of the loops
  std::int64_t images = 0;     ///< images computed
  std::size_t queue_depth = 0;        ///< images in flight (the last loop's)
  std::size_t image_bytes = 0;        ///< one image buffer (the last loop's)
  std::size_t chunk_cache_bytes = 0;  ///< HDF5's chunk cache (the last loop's)
  /// Whether the last loop's heads were read by the threads that computed them
  /// (Selection::HeadReads), not by the reader thread.
  bool computing_threads_read = false;
};

/// The streaming loop's default memory budget (Selection::max_memory = 0).
inline constexpr std::size_t kDefaultMaxMemory = std::size_t{512} << 20;
/// The most images in flight, whatever the budget: more never hides more I/O.
inline constexpr std::size_t kMaxQueueDepth = 8;
/// The most bytes of HDF5 chunk cache a loop asks for (each dataset holds one chunk at most,
/// DumpReader::set_chunk_cache, so a dump chunked one image per chunk uses about one image).
inline constexpr std::size_t kMaxChunkCache = std::size_t{64} << 20;

/// Which part of a dump an analysis reads.
struct Selection {
  std::vector<int> images;  ///< empty: all images
  std::vector<int> layers;  ///< empty: all layers
  std::vector<int> heads;   ///< empty: all heads
  QueryTransform transform;  ///< applied to every Q before any family (default: none)
  /// Whether the analysis uses V. When false the V datasets are not read and HeadView::v refers
  /// to an empty (0 x 0) matrix.
  bool need_v = true;
  /// Whether the analysis uses the model's own tensors: each selected layer's `attn` and `out`
  /// are then read too, where the dump holds them (HeadView::attn, HeadView::out).
  bool need_model_tensors = false;
  /// Bytes the streaming loop may hold: its images in flight, the reader's buffers, the
  /// transformed queries of one image and HDF5's chunk cache (0: kDefaultMaxMemory). An
  /// analysis's own totals (per head, never per image) come on top.
  std::size_t max_memory = 0;
  /// When set, for_each_head adds its measurements here (the copies an analysis makes of its
  /// selection share it).
  std::shared_ptr<LoopStats> stats;
  /// Whether the analysis takes every layer geometry (geometry.hpp: windows, keys from a reduced
  /// grid, heads and dims of its own; HeadView::geometry). When false the loop refuses, naming
  /// the file and layer, a selected layer whose geometry is not the root attributes'.
  bool any_geometry = false;
  /// Without any_geometry: what the analysis is and why it does not take such layers (windows,
  /// reduced keys, another stage's grid), for the refusal ("<analysis>: <why>"); one line.
  std::string geometry_why;
  /// Each layer's own variant, indexed by dump layer (DumpSchema::layer_variant), for a dump
  /// whose layers differ in family: the loop hands each head its layer's (HeadView::own_variant)
  /// and the analysis applies it in place of its one variant (head_variant). Empty: the
  /// analysis's variants apply to every layer.
  std::vector<Variant> own_variants;
  /// Who reads each head's q, k and v in for_each_head_pipelined, where the dump is read
  /// directly (docs/dump-format.md, "Direct reads"; elsewhere, and with a transform, the reader
  /// thread reads whole images): the thread that computes the head, into its core's cache, or
  /// the reader thread, ahead. Auto: the computing threads when they are at least as many as the
  /// CPUs the process may run on (a reader thread would only take time from them), else the
  /// reader thread (a CPU to spare: it reads while they compute).
  enum class HeadReads { Auto, ComputingThreads, ReaderThread };
  HeadReads head_reads = HeadReads::Auto;
  /// The most images in flight (0: kMaxQueueDepth). A path that takes many images per launch
  /// (the GPU's, for_each_image_batch) asks for more read-ahead here; the memory budget still
  /// bounds it.
  std::size_t read_ahead = 0;
};

/// How for_each_head spends its memory budget on a selection.
struct LoopMemory {
  std::size_t image_bytes = 0;  ///< one image in flight (its q, k, v and model tensors)
  std::size_t fixed_bytes = 0;  ///< the reader's buffers and one image's transformed queries
  std::size_t depth = 0;        ///< images in flight: one computed, the others read ahead
  std::size_t chunk_cache = 0;  ///< HDF5's chunk cache
};

/// The plan for `resolved` under its max_memory: at least two images in flight (one computed,
/// one read), at most kMaxQueueDepth (or the selection's read_ahead); the chunk cache gets an eighth of what remains (at most
/// kMaxChunkCache) when two images still fit beside it. UsageError naming the bytes needed when
/// the budget cannot hold two images.
LoopMemory plan_loop_memory(const DumpSchema& schema, const Selection& resolved);

/// Parses a byte size: a whole number with an optional K, M, G or T suffix (powers of 1024,
/// an optional trailing B or iB; e.g. 800M, 2G, 1.5G, 1048576). UsageError naming `flag` when it
/// is not one, or is 0.
std::size_t parse_byte_size(std::string_view text, const std::string& flag);
/// "512 MiB", "1.5 GiB", "800 KiB", "100 bytes".
std::string byte_size_text(std::size_t bytes);

/// One (image, layer, head) work item. q already has the selection's transform applied.
struct HeadView {
  int image = 0;
  int layer = 0;  ///< the dump's layer index
  int head = 0;
  const MatF& q;
  const MatF& k;
  const MatF& v;
  /// The queries as read from the dump, before the selection's transform (== &q when the
  /// transform is none). Analyses that ask whether two queries differ use these.
  const MatF* q_raw = nullptr;
  /// The model's own weights (N x N) and output (N x head_dim) of this head, when the selection
  /// asks for them and the dump holds them; null otherwise.
  const MatF* attn = nullptr;
  const MatF* out = nullptr;
  /// The layer's geometry (never null in a loop): with windows, q holds every window's rows one
  /// window after the other (geometry.hpp), as do k, v, attn and out.
  const LayerGeometry* geometry = nullptr;
  /// The layer's own variant when the selection asks for each layer's (Selection::own_variants).
  const Variant* own_variant = nullptr;
  /// This head's family parameters as the dump records them (/layers/L/family_params of the
  /// head, and the image's /layers/L/agents; docs/dump-format.md), null when the layer has none.
  std::shared_ptr<const FamilyParams> params = nullptr;
};

/// The variant an analysis applies to a head: its layer's own (Selection::own_variants), or
/// variants[vi], with the head's family parameters bound (Variant::params). Every analysis takes
/// its variant here, so a family that needs per-layer data finds it whatever the analysis.
inline Variant head_variant(const std::vector<Variant>& variants, std::size_t vi, const HeadView& hv) {
  return (hv.own_variant != nullptr ? *hv.own_variant : variants[vi]).with_params(hv.params);
}
/// One variant bound to the head's family parameters.
inline Variant head_variant(const Variant& v, const HeadView& hv) { return v.with_params(hv.params); }

/// The variant a row of `layer` was computed under: the layer's own (names non-empty) or `v`'s.
inline std::string row_variant_name(const std::map<int, std::string>& names, const Variant& v,
                                    int layer) {
  const auto it = names.find(layer);
  return names.empty() || it == names.end() ? v.name() : it->second;
}
/// What the rows of all layers together are computed under: "each layer's own" or `v`'s name.
inline std::string all_layers_variant_name(const std::map<int, std::string>& names,
                                           const Variant& v) {
  return names.empty() ? v.name() : "each_layer_own";
}

/// The model's scale of a head's layer (its geometry's, else the dump's).
inline double head_scale(const HeadView& hv, double dump_scale) {
  return hv.geometry != nullptr ? hv.geometry->scale : dump_scale;
}

/// Resolves the selection against the dump (empty lists become everything: heads up to the most
/// heads of any layer, each layer then giving the heads it has) and validates the indices
/// (UsageError naming the bad one).
Selection resolve(const DumpSchema& schema, Selection sel);

/// Reads every layer's family parameters as the loop does before its first image: InputError
/// naming the first one a layer's own family needs and the dump lacks (`info` checks with it
/// what every analysis would refuse).
void check_family_data(const DumpSchema& schema);

/// Calls fn for every selected (image, layer, head), heads of an image in parallel (fn must be
/// thread-safe), images in order. A reader thread fills a bounded queue of reused image buffers
/// (plan_loop_memory) while the current image is computed. on_image(image) runs on the calling
/// thread after each image is done (progress, flushing), outside the parallel region (it may use
/// OpenMP itself), and before any head of the next image. Sets the reader's chunk cache.
void for_each_head(DumpReader& reader, const Selection& resolved,
                   const std::function<void(const HeadView&)>& fn,
                   const std::function<void(int image)>& on_image = {});

/// The lanes the analyses give for_each_head_pipelined: two images in flight, so that a thread
/// that finds no head left of one image starts on the next.
inline constexpr std::size_t kImagesInFlight = 2;

/// Like for_each_head, with no barrier between images: the heads of up to `lanes` consecutive
/// images are handed out, in order, to the threads of one parallel region that lasts the whole
/// loop, so a thread that finds no head left of an image starts on the next one instead of
/// waiting (and the threads are not put to sleep and woken once per image). fn(head, lane) runs
/// on any thread; `lane` (< lanes) is the image's place in a ring of per-image state that the
/// caller keeps: image number n of the loop has lane n % lanes. on_image(image, lane) runs once
/// every head of that image is done, in image order, one call at a time (on whichever thread
/// finished the image), before that lane is given to another image; meanwhile the other threads
/// go on with the heads of the images after it (with one lane there are none: the next image
/// starts after on_image). on_image runs inside the loop's parallel region, so OpenMP in it runs
/// on one thread. The first exception of any call (or of the reader) stops the loop and is
/// rethrown on the calling thread.
void for_each_head_pipelined(DumpReader& reader, const Selection& resolved, std::size_t lanes,
                             const std::function<void(const HeadView&, std::size_t lane)>& fn,
                             const std::function<void(int image, std::size_t lane)>& on_image);

/// The heads of one image, in selection order (layer slot, then head), as for_each_head gives
/// them one at a time.
using ImageHeads = std::vector<HeadView>;

/// Like for_each_head, but whole images at a time for paths that compute many heads in one
/// launch: fn receives up to `max_images` images (every image already read when it is called,
/// at least one, in order) and runs on the calling thread; on_image(image) follows for each of
/// them, in order. The reader keeps reading ahead while fn runs.
void for_each_image_batch(DumpReader& reader, const Selection& resolved, std::size_t max_images,
                          const std::function<void(const std::vector<ImageHeads>&)>& fn,
                          const std::function<void(int image)>& on_image = {});

/// Parses an index list such as "0-9,15,20-22" (ranges inclusive, order kept). Throws UsageError
/// naming `flag` on malformed text (an empty item included) and on an index listed twice. An
/// empty spec gives an empty list (the flag was not given).
std::vector<int> parse_index_list(std::string_view spec, const std::string& flag);

}  // namespace attnscope::analyses
