// HDF5 dump format v1 (docs/dump-format.md): a streaming reader and a writer.
//
// HDF5 (Debian's serial build) is not thread-safe: one DumpReader/DumpWriter is used by one thread
// at a time. Analyses read images on one thread and compute on many.
#pragma once

#include "attnscope/geometry.hpp"
#include "attnscope/layout.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace attnscope {

struct Variant;  // variant.hpp: the dump names a variant; whoever builds one includes the parser

enum class DType { F16, F32 };

/// File attributes of a v1 dump (names as in docs/dump-format.md).
struct DumpAttributes {
  int format_version = 1;
  std::string model_name;
  std::string attention_family = "softmax";  ///< a family of the registry (family.hpp)
  std::string convention = "paper";          ///< paper | code | code+rope
  std::string feature_map = "none";          ///< feature_map spec, "none" for softmax
  double scale = 0.125;
  int num_layers = 0;
  int num_heads = 0;
  int head_dim = 0;
  int num_tokens = 0;
  TokenGrid grid;  ///< grid_height, grid_width, prefix_tokens

  /// The model's own variant (family, map, convention) as a registry object.
  [[nodiscard]] Variant variant(std::uint64_t seed = 0) const;
};

/// What a file holds, learned and validated when it is opened.
struct DumpSchema {
  /// The file; for a dump read from several files, their names joined for messages
  /// ("a.h5, b.h5"; the first and last of more than four).
  std::string path;
  std::vector<std::string> files;  ///< every file, in the order their images follow each other
  std::vector<int> file_images;    ///< the images of each file
  DumpAttributes attrs;
  int num_images = 0;  ///< of all files together
  DType dtype = DType::F32;
  bool has_labels = false, has_logits = false, has_images = false;
  std::vector<bool> layer_has_attn;  ///< per layer: /layers/L/attn present
  std::vector<bool> layer_has_out;   ///< per layer: /layers/L/out present
  std::vector<bool> layer_has_local;  ///< per layer: /layers/L/local present (the local term)
  /// Per layer: its attention_family, feature_map and convention, each the /layers/L group's own
  /// attribute where it has one and the root's otherwise (docs/dump-format.md). The other
  /// fields of each entry are the root's.
  std::vector<DumpAttributes> layer_attrs;
  /// Per layer: its shape (heads, head dim, scale, query and key grids, windows), the /layers/L
  /// group's own attributes over the root's (docs/dump-format.md, "Per-layer geometry").
  std::vector<LayerGeometry> layer_geometry;
  /// The model's layer index of each dump layer (the optional `source_layers` attribute, written
  /// when a subset of the model's layers was dumped): /layers/L holds model layer
  /// source_layers[L]. Empty when the attribute is absent: dump layer L is model layer L.
  std::vector<int> source_layers;
  /// One line each: what the reader noticed and ignored (also sent to the warning handler).
  std::vector<std::string> warnings;

  /// The file holding dump image `image` (several files read as one dump) and the image's index
  /// in it (the first file's, or path's, for an image past the last).
  [[nodiscard]] std::pair<const std::string*, long> image_file(int image) const;
  /// The model's index of dump layer `layer` (the identity without source_layers).
  [[nodiscard]] int model_layer(int layer) const;
  /// The dump layer holding model layer `model_layer_index`, or -1 when the dump lacks it.
  [[nodiscard]] int dump_layer(int model_layer_index) const;
  /// Dump layer `layer`'s own variant (layer_attrs; the root's where the schema has none).
  [[nodiscard]] Variant layer_variant(int layer, std::uint64_t seed = 0) const;
  /// Whether the given dump layers (empty = all) differ in family, feature map or convention.
  [[nodiscard]] bool variants_differ(const std::vector<int>& layers = {}) const;
  /// Dump layer `layer`'s geometry (the root's where the schema has none).
  [[nodiscard]] LayerGeometry geometry(int layer) const;
  /// Whether a given dump layer (-1: any layer) has another shape than the root attributes state.
  [[nodiscard]] bool geometry_differs(int layer = -1) const;
  /// The most heads of any layer (the root's num_heads when no layer says otherwise).
  [[nodiscard]] int max_heads() const;
  /// "0: inline:identity@code, 1: softmax@code" for the given dump layers (empty = all), each
  /// by its model layer index.
  [[nodiscard]] std::string layer_variants_text(const std::vector<int>& layers = {}) const;
};

/// Receives every warning a DumpReader gives while opening a file (one line each, naming the
/// file). By default warnings are only recorded in DumpSchema::warnings; the attnscope command
/// prints them on stderr. Set it once, before readers are opened.
void set_dump_warning_handler(std::function<void(const std::string&)> handler);

/// One layer's q, k or v block of one image that DumpReader::read_image_into(..., defer_direct)
/// left in the file, for whoever computes a head to read (ImageQKV::read_deferred).
struct DeferredBlock {
  int fd = -1;                  ///< the file, open for reading; -1: nothing left to read
  std::uint64_t offset = 0;     ///< where head 0 of the block starts in the file
  std::size_t head_bytes = 0;   ///< one head: rows x head_dim floats, the heads one after another
  const std::string* file = nullptr;  ///< for errors (the reader's: it outlives the image)
  std::string dataset;          ///< e.g. "/layers/3/k"
  int image = 0;                ///< the image's index in that file
  std::vector<std::uint64_t> dims;    ///< the block's shape past the image axis (head first)
  std::vector<const char*> dim_names; ///< names of those axes, for errors
};

/// One image: for each requested layer and each head, Q, K, V as N x head_dim float matrices
/// (per layer its own geometry: LayerGeometry::query_rows() rows of q, key_rows() of k and v,
/// its head_dim columns).
struct ImageQKV {
  int image = -1;
  std::vector<int> layers;  ///< the dump layer index of each slot
  int heads = 0;            ///< the slots' stride: the most heads of any layer (max_heads())
  std::vector<MatF> q, k, v;  ///< index slot * heads + head; 0 x 0 past a layer's own heads
  /// Index slot * 3 + (0 q, 1 k, 2 v): the blocks read_image_into(..., defer_direct) left in the
  /// file (fd >= 0); their heads' matrices are neither sized nor filled until read_deferred.
  std::vector<DeferredBlock> deferred;

  /// Reads head `head` of slot `slot` from the deferred blocks into q, k and v (sized to the
  /// head's shape) and checks it as read_image_into does (one pread per matrix; nothing for
  /// blocks already read). Threads may read distinct heads at once. InputError naming the file,
  /// dataset and image (a read error, the end of the file) or the head, token and dim of the
  /// first NaN/Inf.
  void read_deferred(int slot, int head);
  /// read_deferred into to[0], to[1], to[2] (q, k, v) instead of this image's own matrices: a
  /// computing thread's, reused head after head, so that the pages of the image buffers in
  /// flight are never touched. Returns which were read (bit 0 q, 1 k, 2 v); the others are left
  /// as they are.
  unsigned read_deferred_into(int slot, int head, MatF* const to[3]) const;

  [[nodiscard]] const MatF& Q(int slot, int head) const { return q[slot * heads + head]; }
  [[nodiscard]] const MatF& K(int slot, int head) const { return k[slot * heads + head]; }
  [[nodiscard]] const MatF& V(int slot, int head) const { return v[slot * heads + head]; }
};

/// How one dataset of a file is stored (for `attnscope info`).
struct DatasetInfo {
  std::string name;                   ///< full path, e.g. "/layers/0/q"
  std::vector<std::uint64_t> shape;
  std::string dtype;                  ///< "float32", "float16", "int64", ...
  std::vector<std::uint64_t> chunks;  ///< empty when not chunked
  std::string filters;                ///< e.g. "shuffle+gzip(1)", "none"
};

class DumpReader {
 public:
  /// Opens and validates the file's schema. Throws InputError (file, object, expected, found).
  explicit DumpReader(const std::string& path);
  /// Opens several files as one dump whose images are the files' images in the order given (the
  /// shards of a data-parallel dump). Every file must agree with the first on each attribute an
  /// analysis reads, the dtype, source_layers, which layers hold attn and out, and which of
  /// /labels, /logits, /images are present: otherwise an InputError naming both files, the
  /// attribute and the two values. Errors reading an image name the file holding it, its
  /// dataset, and the image's index within that file.
  explicit DumpReader(const std::vector<std::string>& paths);
  ~DumpReader();
  DumpReader(const DumpReader&) = delete;
  DumpReader& operator=(const DumpReader&) = delete;

  [[nodiscard]] const DumpSchema& schema() const;
  /// Reads one image of the given layers (empty = all). Reads chunk by chunk: memory is bounded by
  /// one image of one layer beyond the result. Throws InputError on NaN/Inf, naming
  /// dataset, image, head, token and dim of the first one. Without with_v the V datasets are not
  /// read: ImageQKV::v then holds empty (0 x 0) matrices, one per slot, so V() stays valid.
  [[nodiscard]] ImageQKV read_image(int image, const std::vector<int>& layers = {},
                                    bool with_v = true);
  /// The same into `img`, reusing its matrices' storage when the shapes match (a streaming
  /// loop then allocates, and page-faults, nothing per image). With defer_direct, the blocks
  /// that would be read straight from the file (direct_reads) are not read here: their places
  /// go to img.deferred and the heads' matrices are only allocated, so that each head is read by
  /// the thread that computes it (ImageQKV::read_deferred), into that core's cache, while this
  /// thread goes on. Every other block is read here as without it. The reader must outlive
  /// those reads.
  void read_image_into(ImageQKV& img, int image, const std::vector<int>& layers = {},
                       bool with_v = true, bool defer_direct = false);
  /// Optional per-layer tensors of one image and head (nullopt when the dataset is absent). In
  /// the layer's geometry: attn is query_rows() x unit_keys() (a layer with windows: each
  /// window's block under the one before), out and local query_rows() x head_dim.
  [[nodiscard]] std::optional<MatF> read_attn(int image, int layer, int head);  ///< N x N
  [[nodiscard]] std::optional<MatF> read_out(int image, int layer, int head);   ///< N x head_dim
  /// The layer's local term (InLine's local residual, FLatten's depthwise convolution), which the
  /// model adds to `out` = W V before its output projection.
  [[nodiscard]] std::optional<MatF> read_local(int image, int layer, int head);  ///< N x head_dim
  [[nodiscard]] std::vector<std::int64_t> read_labels();
  [[nodiscard]] MatF read_logits();  ///< images x classes
  /// Input images as images x (C*H*W) with their shape in `shape` (C, H, W).
  [[nodiscard]] MatF read_images(std::vector<int>* shape);
  /// One image of /images (the model's input) as C*H*W floats in the dataset's order (channel,
  /// row, column), its shape (C, H, W) in `shape`. InputError naming the file and /images when
  /// the dump has none, or at a NaN/Inf.
  [[nodiscard]] VecF read_input_image(int image, std::vector<int>* shape = nullptr);
  /// A token mask stored in the dump: dataset `name` (a path from the root, the leading '/'
  /// optional) of shape [images, num_tokens], dtype uint8 or bool (h5py's bool enum), every value
  /// 0 or 1. One byte per (image, token), images in order (several files: each file's in turn).
  /// InputError naming the file and dataset otherwise (a bad value: its image and token too).
  [[nodiscard]] std::vector<unsigned char> read_token_masks(const std::string& name);
  /// Every dataset of the dump in format order (layers, then /labels, /logits, /images); with
  /// several files, each file's in turn, names prefixed by "FILE:".
  [[nodiscard]] std::vector<DatasetInfo> datasets() const;

  /// Caps HDF5's chunk cache at `bytes` for the whole reader (default 32 MiB): split evenly over
  /// one file's datasets, each holding one chunk at most, and only the file read last keeps its
  /// caches (a file's are emptied when the reader moves to another), so it grows neither with
  /// the dump's size nor with the number of files.
  void set_chunk_cache(std::size_t bytes);
  [[nodiscard]] std::size_t chunk_cache() const;
  /// How many blocks (one layer's q, k or v of one image) read_image and read_image_into have
  /// read straight from the file into the head matrices, bypassing HDF5's buffers: the blocks of
  /// uncompressed float32 datasets, contiguous or chunked by whole images (docs/dump-format.md).
  /// Every other block goes through HDF5; both give the same values.
  [[nodiscard]] std::size_t direct_reads() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Bytes of the buffers a DumpReader of such a dump keeps for its reads (one layer's q, k or v,
/// or one head's attn, as float and as raw half), besides the images it fills and the chunk cache.
[[nodiscard]] std::size_t read_buffer_bytes(const DumpAttributes& attrs);
/// The same for a dump whose layers may differ in geometry: its largest layer's buffers.
[[nodiscard]] std::size_t read_buffer_bytes(const DumpSchema& schema);

struct DumpWriterOptions {
  DType dtype = DType::F32;
  int compression = 1;  ///< gzip level 0-9 (0 = none); shuffle filter on when > 0
  bool with_attn = false;
  bool with_out = false;
};

/// Writes to "<path>.tmp-<pid>" and renames to `path` in close(); a writer destroyed without
/// close() (an exception, a crash) removes its temporary file, so no half-written file is left
/// looking complete.
class DumpWriter {
 public:
  DumpWriter(const std::string& path, const DumpAttributes& attrs, const DumpWriterOptions& opts);
  ~DumpWriter();
  DumpWriter(const DumpWriter&) = delete;
  DumpWriter& operator=(const DumpWriter&) = delete;

  /// Appends one image (all layers, in order). attn/out, when the options ask for them, are
  /// indexed like ImageQKV::q (layer * heads + head).
  void append(const ImageQKV& img, const std::vector<MatF>* attn = nullptr,
              const std::vector<MatF>* out = nullptr);
  void set_labels(const std::vector<std::int64_t>& labels);
  void set_logits(const MatF& logits);
  /// images x (C*H*W) plus shape (C, H, W).
  void set_images(const MatF& images, const std::vector<int>& shape);
  /// Flushes, closes and renames into place.
  void close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace attnscope
