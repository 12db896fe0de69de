// DumpReader: validates a v1 dump on open, then streams it image by image with hyperslab reads.
#include "dump_internal.hpp"
#include "hdf5_util.hpp"

#include "attnscope/error.hpp"
#include "attnscope/half.hpp"
#include "attnscope/input_files.hpp"
#include "attnscope/variant.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>

namespace attnscope {

using dump_detail::check_finite;
using dump_detail::layer_path;
using dump_detail::open_dataset;
using dump_detail::read_floats;

namespace {

/// Where the images of an uncompressed float32 dataset lie in the file, for reads that bypass
/// HDF5: pread straight into the head matrices, one copy (the kernel's) where HDF5's read into a
/// buffer and the copy from it into the heads were two. Known for contiguous datasets and for
/// chunked ones whose chunks hold whole images; every other dataset (filters, another dtype or
/// byte order, chunks that split an image, external storage, a user block) is read by HDF5.
struct DirectLayout {
  bool examined = false;
  bool direct = false;
  bool chunked = false;
  haddr_t address = HADDR_UNDEF;  // contiguous: where the data starts
  int rank = 0;
  hsize_t chunk_images = 0;       // chunked: images per chunk
  std::size_t image_bytes = 0;    // one image's block
};

struct LayerSets {
  h5::Handle q, k, v, attn, out, local;
  DirectLayout direct[3];  // of q, k and v
};

constexpr const char* kQkvLayout = "[images, heads, tokens, dim]";

}  // namespace

namespace dump_detail {

h5::Handle open_read_only(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw InputError(path, "", "an existing file", "none");
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw InputError(path, "", "a regular file", "a folder or special file");
  }
  h5::quiet_hdf5();
  const htri_t is_h5 = H5Fis_hdf5(path.c_str());
  if (is_h5 <= 0) {
    const std::string why = is_h5 < 0 ? h5::last_error() : "";
    throw InputError(path, "", "an HDF5 file",
                     why.empty() ? "no HDF5 signature" : "an unreadable file (" + why + ")");
  }
  // flat with many files open; global heap collections checked before HDF5 trusts them
  const h5::Handle fapl = h5::checked_read_fapl();
  h5::Handle f = h5::file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()));
  if (!f.valid()) {
    const std::vector<std::string> stack = h5::error_stack();
    const auto says = [&stack](const char* text) {
      return std::any_of(stack.begin(), stack.end(), [text](const std::string& m) {
        return m.find(text) != std::string::npos;
      });
    };
    // A writer holds HDF5's file lock (a live process), or left the superblock's "open for
    // writing" mark behind (a writer killed before it closed the file): neither is damage.
    if (says("unable to lock file")) {
      throw InputError(path, "", "a readable HDF5 file",
                       "a file locked by another process (a writer still has it open: wait for "
                       "it to finish, or read it anyway with HDF5_USE_FILE_LOCKING=FALSE)");
    }
    if (says("file is already open for write")) {
      throw InputError(path, "", "a readable HDF5 file",
                       "a file marked as open for writing (a writer did not close it; if no "
                       "writer is running, clear the mark with 'h5clear -s " + path + "')");
    }
    throw InputError(path, "", "a readable HDF5 file",
                     "a damaged or truncated file (" + (stack.empty() ? "" : stack.back()) + ")");
  }
  note_input_file(path);
  return f;
}


/// Opens a dataset, checking it is one (a group of the same name is reported, not crashed on)
/// and that this HDF5 can apply every filter its chunks were written with. H5Oopen and
/// H5Iget_type have kept one signature from HDF5 1.8 to 1.14, unlike H5Oget_info*.
h5::Handle open_dataset(hid_t file, const std::string& name, const std::string& path) {
  if (!h5::exists(file, name.substr(1))) throw InputError(path, name, "a dataset", "none");
  const hid_t obj = H5Oopen(file, name.c_str(), H5P_DEFAULT);
  if (obj < 0) throw InputError(path, name, "a readable dataset", h5::last_error());
  if (H5Iget_type(obj) != H5I_DATASET) {
    H5Oclose(obj);
    throw InputError(path, name, "a dataset", "another kind of object");
  }
  h5::Handle d = h5::dataset(obj);
  const std::vector<std::string> missing = h5::unavailable_filters(d.get());
  if (!missing.empty()) {
    throw InputError(path, name, "compression filters this HDF5 provides",
                     missing.front() + ", which this HDF5 does not provide (rewrite the dump "
                     "with gzip compression, e.g. from h5py)");
  }
  return d;
}

}  // namespace dump_detail

namespace {

DType dataset_dtype(hid_t ds, const std::string& name, const std::string& path) {
  h5::Handle t = h5::type(H5Dget_type(ds));
  if (H5Tget_class(t.get()) == H5T_FLOAT) {
    std::size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
    H5Tget_fields(t.get(), &spos, &epos, &esize, &mpos, &msize);
    if (H5Tget_size(t.get()) == 4 && msize == 23) return DType::F32;
    if (H5Tget_size(t.get()) == 2 && msize == 10 && esize == 5) return DType::F16;
  }
  throw InputError(path, name, "dtype float32 or float16", h5::describe_type(t.get()));
}

std::string dims_text(const std::vector<hsize_t>& want, bool images_free) {
  std::string s = "shape [";
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (i > 0) s += ", ";
    s += i == 0 && images_free ? std::string("images") : std::to_string(want[i]);
  }
  return s + "]";
}

/// Checks the shape; want[0] is the image count, or ignored (any) when images_free. `layout`
/// names the dimensions (e.g. "[images, heads, tokens, dim]"), for a scalar found instead.
void check_shape(hid_t ds, const std::string& name, const std::string& path,
                 const std::vector<hsize_t>& want, bool images_free, const char* layout) {
  const std::vector<hsize_t> got = h5::dims(ds);
  if (got.empty()) {
    throw InputError(path, name,
                     "a " + std::to_string(want.size()) + "-D dataset " + layout, "a scalar");
  }
  bool ok = got.size() == want.size();
  for (std::size_t i = 0; ok && i < want.size(); ++i) {
    ok = (i == 0 && images_free) || got[i] == want[i];
  }
  if (!ok) throw InputError(path, name, dims_text(want, images_free), h5::shape_string(got));
}

void check_float_class(hid_t ds, const std::string& name, const std::string& path) {
  h5::Handle t = h5::type(H5Dget_type(ds));
  if (H5Tget_class(t.get()) != H5T_FLOAT) {
    throw InputError(path, name, "a float dtype", h5::describe_type(t.get()));
  }
}

std::string filters_of(hid_t dcpl) {
  std::string out;
  const int n = H5Pget_nfilters(dcpl);
  for (int i = 0; i < n; ++i) {
    unsigned flags = 0, cd[8] = {};
    std::size_t ncd = 8;
    char name[64] = {};
    const H5Z_filter_t id = H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &ncd, cd,
                                           sizeof name, name, nullptr);
    std::string f = id == H5Z_FILTER_DEFLATE   ? "gzip(" + std::to_string(ncd > 0 ? cd[0] : 0) + ")"
                    : id == H5Z_FILTER_SHUFFLE ? "shuffle"
                                               : std::string(name[0] ? name : "filter");
    if (!out.empty()) out += '+';
    out += f;
  }
  return out.empty() ? "none" : out;
}

/// True for the IEEE half layout (h5py's numpy.float16) in either byte order: such data can be
/// read as raw bits and widened by half_to_float, exactly.
bool is_ieee_half(hid_t type) {
  if (H5Tget_class(type) != H5T_FLOAT || H5Tget_size(type) != 2) return false;
  std::size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
  H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize);
  return spos == 15 && epos == 10 && esize == 5 && mpos == 0 && msize == 10 &&
         H5Tget_ebias(type) == 15 && H5Tget_norm(type) == H5T_NORM_IMPLIED;
}

}  // namespace

namespace dump_detail {

/// Reads the selection `fs` of `ds` into `out` (`n` floats laid out as `ms`). IEEE half data is
/// read with a little-endian half memory type (no conversion, or a plain byte swap) into
/// `scratch` and widened here: HDF5's own half-to-float path is a slow soft conversion. Anything
/// else is converted by HDF5. Returns an empty string, or HDF5's diagnosis of a failure (taken
/// at once: closing the type handle would clear the error stack).
std::string read_floats(hid_t ds, hid_t ms, hid_t fs, float* out, std::size_t n, hid_t half,
                        std::vector<std::uint16_t>& scratch) {
  const h5::Handle t = h5::type(H5Dget_type(ds));
  const auto failed = [] {
    const std::string why = h5::last_error();
    return why.empty() ? std::string("no diagnosis from HDF5") : why;
  };
  if (!t.valid()) return failed();
  if (!is_ieee_half(t.get())) {
    return H5Dread(ds, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, out) < 0 ? failed() : "";
  }
  scratch.resize(n);
  if (H5Dread(ds, half, ms, fs, H5P_DEFAULT, scratch.data()) < 0) return failed();
  for (std::size_t i = 0; i < n; ++i) out[i] = half_to_float(scratch[i]);
  return "";
}

}  // namespace dump_detail

namespace {

/// Where the reader's warnings go (set_dump_warning_handler).
std::mutex warning_mutex;
std::function<void(const std::string&)>& warning_handler() {
  static std::function<void(const std::string&)> handler;
  return handler;
}

void warn(DumpSchema& schema, const std::string& text) {
  schema.warnings.push_back(text);
  std::lock_guard<std::mutex> lock(warning_mutex);
  if (warning_handler()) warning_handler()(text);
}

/// Links of /layers other than the groups 0 .. num_layers-1 (ignored by the reader).
std::vector<std::string> extra_layer_links(hid_t file, int num_layers) {
  std::vector<std::string> extra;
  h5::Handle g = h5::group(H5Gopen2(file, "layers", H5P_DEFAULT));
  H5G_info_t info;
  if (!g.valid() || H5Gget_info(g.get(), &info) < 0) return extra;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len = H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr,
                                           0, H5P_DEFAULT);
    if (len <= 0) continue;
    std::string name(static_cast<std::size_t>(len) + 1, '\0');
    H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(),
                       H5P_DEFAULT);
    name.resize(static_cast<std::size_t>(len));
    bool expected = !name.empty() && name.size() < 10 &&
                    std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; });
    expected = expected && (name == "0" || name[0] != '0') && std::stoi(name) < num_layers;
    if (!expected) extra.push_back("/layers/" + name);
  }
  H5Eclear2(H5E_DEFAULT);
  return extra;
}

}  // namespace


/// What every file of a reader shares: the block buffers and the half type of the raw reads,
/// and the chunk cache each dataset may have.
struct ReadScratch {
  h5::Handle half = h5::half_type();  // little-endian IEEE half, the raw-read memory type
  std::vector<float> buf;
  std::vector<std::uint16_t> half_buf;
  std::size_t dataset_cache = 0;  // the most chunk cache one dataset may have
};

/// Bytes of one chunk of `ds` (0 when it is not chunked).
std::size_t chunk_bytes(hid_t ds) {
  h5::Handle dcpl = h5::plist(H5Dget_create_plist(ds));
  if (H5Pget_layout(dcpl.get()) != H5D_CHUNKED) return 0;
  const int rank = H5Pget_chunk(dcpl.get(), 0, nullptr);
  std::vector<hsize_t> dims(static_cast<std::size_t>(std::max(rank, 0)));
  if (rank <= 0 || H5Pget_chunk(dcpl.get(), rank, dims.data()) < 0) return 0;
  h5::Handle t = h5::type(H5Dget_type(ds));
  std::size_t n = H5Tget_size(t.get());
  for (hsize_t d : dims) n *= static_cast<std::size_t>(d);
  return n;
}

/// One file of a dump: its schema (image indices local to the file) and open datasets.
struct FileReader {
  h5::Handle file;  // declared first: closed last
  DumpSchema schema;
  std::vector<LayerSets> layers;
  h5::Handle labels, logits, images;
  ReadScratch* scratch = nullptr;
  int shard_first_image = -1;  // the optional attribute of a shard (-1: absent)
  int fd = -1;                 // the file opened again for direct reads (-1: HDF5 reads all)
  bool user_block = false;     // addresses are then not file offsets: no direct reads
  bool probe_chunks = false;   // chunks found by h5::chunk_location (the file reads through the checked driver)
  std::unique_ptr<char[]> probe_buf;  // what chunk_location is handed, never written
  std::size_t probe_buf_bytes = 0;
  std::size_t direct_blocks = 0;  // image blocks read directly (DumpReader::direct_reads)

  FileReader(const std::string& path, ReadScratch& s);
  ~FileReader();
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;
  /// Reads image `image`'s block of `ds` straight into `heads` matrices of rows x d each (its
  /// first `heads` heads, the block's order): false, reading nothing, when the dataset is not
  /// laid out for it (DirectLayout) or this image's chunk is not allocated; then HDF5 reads it.
  /// With `defer_to`, reads nothing either way: records where the block lies there instead
  /// (DeferredBlock; ImageQKV::read_deferred reads it).
  bool read_direct(hid_t ds, DirectLayout& layout, const std::string& name, int image,
                   const std::vector<hsize_t>& dims, const std::vector<const char*>& dim_names,
                   MatF* const* heads, int count, int rows, int d, DeferredBlock* defer_to = nullptr);
  /// The shape of /layers/L/`name` past the image axis, in the layer's geometry, and its names.
  struct LayerShape {
    std::vector<hsize_t> dims;
    const char* layout;
  };
  [[nodiscard]] LayerShape layer_shape(int layer, std::string_view name) const;
  void open_layers();
  void open_optional();
  /// Opens every dataset again with a chunk cache of at most scratch->dataset_cache bytes (and
  /// one chunk): applies a new size, and drops whatever the old caches held.
  void reopen_datasets();
  void read_image_into(ImageQKV& img, int image, const std::vector<int>& layers, bool with_v,
                       bool defer_direct);
  /// One head of /layers/L/attn, out or local (`name`); nullopt when the dataset is absent.
  std::optional<MatF> read_head(int image, int layer, int head, const char* name);
  /// One image of /images (present), C*H*W floats; its shape (C, H, W) in `shape`.
  VecF read_input_image(int image, std::vector<int>* shape);
  /// The token mask `name` of this file's images (DumpReader::read_token_masks), into `out`.
  void read_token_masks(const std::string& name, unsigned char* out) const;
  /// Reads block [image, start...] of shape [1, count...] as float into buf; checks finiteness.
  const float* read_block(hid_t ds, const std::string& name, int image,
                          const std::vector<hsize_t>& start, const std::vector<hsize_t>& count,
                          const std::vector<const char*>& labels_of_dims);
  void check_image(int image) const;
  void check_layer(int layer) const;
  void check_head(int layer, int head) const;
};

FileReader::LayerShape FileReader::layer_shape(int layer, std::string_view name) const {
  const LayerGeometry& g = schema.layer_geometry[static_cast<std::size_t>(layer)];
  const auto H = static_cast<hsize_t>(g.num_heads), d = static_cast<hsize_t>(g.head_dim);
  const bool keys = name == "k" || name == "v";
  if (g.windows > 0) {
    const auto W = static_cast<hsize_t>(g.windows), T = static_cast<hsize_t>(g.window_tokens());
    if (name == "attn") return {{H, W, T, T}, "[images, heads, windows, queries, keys]"};
    return {{H, W, T, d}, "[images, heads, windows, window_tokens, dim]"};
  }
  const auto Nq = static_cast<hsize_t>(g.grid.tokens()), Nk = static_cast<hsize_t>(g.key_grid.tokens());
  if (name == "attn") return {{H, Nq, Nk}, "[images, heads, tokens, key_tokens]"};
  return {{H, keys ? Nk : Nq, d}, keys ? "[images, heads, key_tokens, dim]" : kQkvLayout};
}

void FileReader::open_layers() {
  const std::string& path = schema.path;
  const DumpAttributes& a = schema.attrs;
  if (!h5::exists(file.get(), "layers")) throw InputError(path, "/layers", "a group", "none");
  layers.resize(static_cast<std::size_t>(a.num_layers));
  for (int l = 0; l < a.num_layers; ++l) {
    const std::string group = "/layers/" + std::to_string(l);
    if (!h5::exists(file.get(), group.substr(1))) {
      throw InputError(path, group,
                       "a layer group (num_layers = " + std::to_string(a.num_layers) + ")", "none");
    }
    schema.layer_attrs.push_back(dump_detail::read_layer_attributes(file.get(), group, a, path));
    schema.layer_geometry.push_back(dump_detail::read_layer_geometry(file.get(), group, a, path));
    LayerSets& ls = layers[static_cast<std::size_t>(l)];
    h5::Handle* sets[3] = {&ls.q, &ls.k, &ls.v};
    const char* names[3] = {"q", "k", "v"};
    for (int s = 0; s < 3; ++s) {
      const std::string name = layer_path(l, names[s]);
      *sets[s] = open_dataset(file.get(), name, path);
      const std::vector<hsize_t> got = h5::dims(sets[s]->get());
      const bool first = l == 0 && s == 0;
      const hsize_t n = first && !got.empty() ? got[0] : static_cast<hsize_t>(schema.num_images);
      const LayerShape shape = layer_shape(l, names[s]);
      std::vector<hsize_t> want{n};
      want.insert(want.end(), shape.dims.begin(), shape.dims.end());
      check_shape(sets[s]->get(), name, path, want, false, shape.layout);
      const DType t = dataset_dtype(sets[s]->get(), name, path);
      if (first) {
        schema.num_images = static_cast<int>(n);
        schema.dtype = t;
      } else if (t != schema.dtype) {
        throw InputError(path, name,
                         std::string("the dtype of /layers/0/q (") +
                             (schema.dtype == DType::F16 ? "float16" : "float32") + ")",
                         t == DType::F16 ? "float16" : "float32");
      }
    }
  }
  const std::vector<std::string> extra = extra_layer_links(file.get(), a.num_layers);
  if (!extra.empty()) {
    std::string names;
    for (const std::string& e : extra) names += (names.empty() ? "" : ", ") + e;
    warn(schema, path + ": " + names + ": not among the num_layers = " +
                     std::to_string(a.num_layers) + " layer groups, ignored");
  }
}

void FileReader::open_optional() {
  const std::string& path = schema.path;
  const auto n = static_cast<hsize_t>(schema.num_images);
  schema.layer_has_attn.assign(layers.size(), false);
  schema.layer_has_out.assign(layers.size(), false);
  schema.layer_has_local.assign(layers.size(), false);
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const int li = static_cast<int>(l);
    const std::pair<const char*, std::pair<h5::Handle*, std::vector<bool>*>> sets[3] = {
        {"attn", {&layers[l].attn, &schema.layer_has_attn}},
        {"out", {&layers[l].out, &schema.layer_has_out}},
        {"local", {&layers[l].local, &schema.layer_has_local}}};
    for (const auto& [what, where] : sets) {
      const std::string name = layer_path(li, what);
      if (!h5::exists(file.get(), name.substr(1))) continue;
      *where.first = open_dataset(file.get(), name, path);
      const LayerShape shape = layer_shape(li, what);
      std::vector<hsize_t> want{n};
      want.insert(want.end(), shape.dims.begin(), shape.dims.end());
      check_shape(where.first->get(), name, path, want, false, shape.layout);
      check_float_class(where.first->get(), name, path);
      (*where.second)[l] = true;
    }
  }
  if (h5::exists(file.get(), "labels")) {
    labels = open_dataset(file.get(), "/labels", path);
    check_shape(labels.get(), "/labels", path, {n}, false, "[images]");
    h5::Handle t = h5::type(H5Dget_type(labels.get()));
    if (H5Tget_class(t.get()) != H5T_INTEGER) {
      throw InputError(path, "/labels", "an integer dtype", h5::describe_type(t.get()));
    }
    schema.has_labels = true;
  }
  if (h5::exists(file.get(), "logits")) {
    logits = open_dataset(file.get(), "/logits", path);
    const auto got = h5::dims(logits.get());
    check_shape(logits.get(), "/logits", path, {n, got.size() == 2 ? got[1] : 1}, false,
                "[images, classes]");
    check_float_class(logits.get(), "/logits", path);
    schema.has_logits = true;
  }
  if (h5::exists(file.get(), "images")) {
    images = open_dataset(file.get(), "/images", path);
    const auto got = h5::dims(images.get());
    if (got.size() != 4 || got[0] != n) {
      throw InputError(path, "/images", "shape [" + std::to_string(n) + ", C, H, W]",
                       h5::shape_string(got));
    }
    check_float_class(images.get(), "/images", path);
    schema.has_images = true;
  }
}

const float* FileReader::read_block(hid_t ds, const std::string& name, int image,
                                          const std::vector<hsize_t>& start,
                                          const std::vector<hsize_t>& count,
                                          const std::vector<const char*>& labels_of_dims) {
  std::vector<hsize_t> off{static_cast<hsize_t>(image)}, cnt{1};
  off.insert(off.end(), start.begin(), start.end());
  cnt.insert(cnt.end(), count.begin(), count.end());
  hsize_t total = 1;
  for (hsize_t c : count) total *= c;
  scratch->buf.resize(static_cast<std::size_t>(total));
  // The memory space has the selection's own rank and shape: HDF5 then copies the contiguous
  // block in one piece, where a rank-1 memory space makes it iterate element by element.
  h5::Handle fs = h5::space(H5Dget_space(ds));
  h5::Handle ms = h5::space(H5Screate_simple(static_cast<int>(cnt.size()), cnt.data(), nullptr));
  std::string why;
  if (H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, off.data(), nullptr, cnt.data(), nullptr) < 0) {
    why = h5::last_error();
  } else {
    why = read_floats(ds, ms.get(), fs.get(), scratch->buf.data(), scratch->buf.size(),
                      scratch->half.get(), scratch->half_buf);
  }
  if (!why.empty()) {
    throw InputError(schema.path, name, "readable data at image " + std::to_string(image),
                     "a read error (" + why + ")");
  }
  check_finite(scratch->buf.data(), start, count, labels_of_dims, schema.path, name, image);
  return scratch->buf.data();
}

void FileReader::check_image(int image) const {
  if (schema.num_images == 0) {
    throw InputError(schema.path, "/layers/0/q", "at least one image", "no images");
  }
  if (image < 0 || image >= schema.num_images) {
    throw UsageError(schema.path + ": image " + std::to_string(image) + " out of range [0, " +
                     std::to_string(schema.num_images) + ")");
  }
}

void FileReader::check_layer(int layer) const {
  if (layer < 0 || layer >= schema.attrs.num_layers) {
    throw UsageError(schema.path + ": layer " + std::to_string(layer) + " out of range [0, " +
                     std::to_string(schema.attrs.num_layers) + ")");
  }
}

void FileReader::check_head(int layer, int head) const {
  const int heads = schema.layer_geometry[static_cast<std::size_t>(layer)].num_heads;
  if (head < 0 || head >= heads) {
    throw UsageError(schema.path + ": head " + std::to_string(head) + " out of range [0, " +
                     std::to_string(heads) + ") of layer " + std::to_string(layer));
  }
}

FileReader::FileReader(const std::string& path, ReadScratch& s) : scratch(&s) {
  schema.path = path;
  schema.files = {path};
  file = dump_detail::open_read_only(path);
  h5::Handle root = h5::group(H5Gopen2(file.get(), "/", H5P_DEFAULT));
  schema.attrs = dump_detail::read_attributes(root.get(), path);
  schema.source_layers = dump_detail::read_source_layers(root.get(), path, schema.attrs.num_layers);
  if (H5Aexists(root.get(), "shard_first_image") > 0) {
    shard_first_image = dump_detail::root_int(root.get(), "shard_first_image", path);
  }
  open_layers();
  open_optional();
  schema.file_images = {schema.num_images};
  h5::Handle fcpl = h5::plist(H5Fget_create_plist(file.get()));
  hsize_t block = 0;
  user_block = !fcpl.valid() || H5Pget_userblock(fcpl.get(), &block) < 0 || block != 0;
  H5Eclear2(H5E_DEFAULT);
  fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // failing, HDF5 reads everything
  probe_chunks = h5::reads_through_checked_driver(file.get());
}

FileReader::~FileReader() {
  if (fd >= 0) ::close(fd);
}

namespace {

/// Fills `m` (its size in bytes, already allocated) with head `head` of a block whose shape past
/// the image axis is `dims` (head first), from the file at byte `at`, with pread, and checks it
/// for finiteness. InputError naming file, dataset and image at a read error or the end of the
/// file, and the head, token and dim of the first NaN/Inf.
void read_head_at(int fd, MatF& m, std::uint64_t at, int head, std::vector<hsize_t> dims,
                  const std::vector<const char*>& dim_names, const std::string& file,
                  const std::string& dataset, int image) {
  auto* dst = reinterpret_cast<char*>(m.data());
  const std::size_t bytes = static_cast<std::size_t>(m.size()) * sizeof(float);
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t got = ::pread(fd, dst + done, bytes - done, static_cast<off_t>(at + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      throw InputError(file, dataset, "readable data at image " + std::to_string(image),
                       got < 0 ? std::string("a read error (") + std::strerror(errno) + ")"
                               : std::string("the end of the file (truncated?)"));
    }
    done += static_cast<std::size_t>(got);
  }
  std::vector<hsize_t> start(dims.size(), 0);
  start[0] = static_cast<hsize_t>(head);
  dims[0] = 1;
  check_finite(m.data(), start, dims, dim_names, file, dataset, image);
}

DirectLayout examine_layout(hid_t ds, std::size_t image_bytes) {
  DirectLayout d;
  d.examined = true;
  d.image_bytes = image_bytes;
  h5::Handle t = h5::type(H5Dget_type(ds));
  h5::Handle dcpl = h5::plist(H5Dget_create_plist(ds));
  h5::Handle space = h5::space(H5Dget_space(ds));
  if (!t.valid() || !dcpl.valid() || !space.valid() || H5Tequal(t.get(), H5T_NATIVE_FLOAT) <= 0 ||
      H5Pget_nfilters(dcpl.get()) != 0 || H5Pget_external_count(dcpl.get()) != 0) {
    H5Eclear2(H5E_DEFAULT);
    return d;
  }
  d.rank = H5Sget_simple_extent_ndims(space.get());
  if (d.rank < 1) return d;
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout == H5D_CONTIGUOUS) {
    d.address = H5Dget_offset(ds);
    H5Eclear2(H5E_DEFAULT);
    d.direct = d.address != HADDR_UNDEF;  // undefined: no storage yet
  } else if (layout == H5D_CHUNKED) {
    std::vector<hsize_t> dims(static_cast<std::size_t>(d.rank)), chunk(dims.size());
    if (H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0 ||
        H5Pget_chunk(dcpl.get(), d.rank, chunk.data()) != d.rank) {
      H5Eclear2(H5E_DEFAULT);
      return d;
    }
    // Each chunk must hold whole images: every axis past the first is whole in it.
    d.direct = chunk[0] >= 1 && std::equal(dims.begin() + 1, dims.end(), chunk.begin() + 1);
    d.chunked = true;
    d.chunk_images = chunk[0];
  }
  return d;
}

}  // namespace

bool FileReader::read_direct(hid_t ds, DirectLayout& layout, const std::string& name, int image,
                             const std::vector<hsize_t>& dims, const std::vector<const char*>& dim_names,
                             MatF* const* heads, int count, int rows, int d,
                             DeferredBlock* defer_to) {
  if (fd < 0 || user_block) return false;
  if (!layout.examined) {
    std::size_t bytes = sizeof(float);
    for (hsize_t x : dims) bytes *= static_cast<std::size_t>(x);
    layout = examine_layout(ds, bytes);
  }
  if (!layout.direct) return false;
  const auto head_bytes = static_cast<std::size_t>(rows) * static_cast<std::size_t>(d) * sizeof(float);
  if (head_bytes * static_cast<std::size_t>(count) > layout.image_bytes) return false;
  haddr_t at = HADDR_UNDEF;
  if (!layout.chunked) {
    at = layout.address + static_cast<haddr_t>(image) * layout.image_bytes;
  } else {
    std::vector<hsize_t> coord(static_cast<std::size_t>(layout.rank), 0);
    const auto within = static_cast<hsize_t>(image) % layout.chunk_images;
    coord[0] = static_cast<hsize_t>(image) - within;
    unsigned filters = 0;
    haddr_t chunk = HADDR_UNDEF;
    std::size_t size = 0;
    bool found = false;
    if (probe_chunks) {  // through the chunk index
      const std::size_t chunk_bytes = static_cast<std::size_t>(layout.chunk_images) * layout.image_bytes;
      if (probe_buf_bytes < chunk_bytes) {
        probe_buf.reset(new char[chunk_bytes]);  // never written (chunk_location): never touched
        probe_buf_bytes = chunk_bytes;
      }
      found = h5::chunk_location(ds, coord.data(), probe_buf.get(), &chunk, &size, &filters);
    } else {  // walks the chunks before it (HDF5 1.10)
      hsize_t stored = 0;
      found = H5Dget_chunk_info_by_coord(ds, coord.data(), &filters, &chunk, &stored) >= 0;
      size = static_cast<std::size_t>(stored);
    }
    if (!found || chunk == HADDR_UNDEF || filters != 0 || size < (within + 1) * layout.image_bytes) {
      H5Eclear2(H5E_DEFAULT);
      return false;  // not allocated (fill values): HDF5 knows what to read
    }
    at = chunk + within * layout.image_bytes;
  }
  ++direct_blocks;
  if (defer_to != nullptr) {
    defer_to->fd = fd;
    defer_to->offset = at;
    defer_to->head_bytes = head_bytes;
    defer_to->file = &schema.path;
    defer_to->dataset = name;
    defer_to->image = image;
    defer_to->dims.assign(dims.begin(), dims.end());
    defer_to->dim_names = dim_names;
    return true;
  }
  for (int h = 0; h < count; ++h) {
    read_head_at(fd, *heads[h], at + h * head_bytes, h, dims, dim_names, schema.path, name, image);
  }
  return true;
}

void FileReader::reopen_datasets() {
  // Each dataset's cache holds one chunk at most: with one image per chunk that serves the
  // per-head reads of attn and out, with several it serves the images that follow; more would
  // only keep chunks that are never read again.
  const auto reopen = [this](h5::Handle& h, const std::string& name) {
    if (!h.valid()) return;
    const std::size_t bytes = std::min(chunk_bytes(h.get()), scratch->dataset_cache);
    h.reset();
    h5::Handle dapl = h5::plist(H5Pcreate(H5P_DATASET_ACCESS));
    if (H5Pset_chunk_cache(dapl.get(), H5D_CHUNK_CACHE_NSLOTS_DEFAULT, bytes,
                           H5D_CHUNK_CACHE_W0_DEFAULT) < 0) {
      throw Error("cannot set HDF5's chunk cache: " + h5::last_error());
    }
    h = h5::dataset(H5Dopen2(file.get(), name.c_str(), dapl.get()));
    if (!h.valid()) throw InputError(schema.path, name, "a readable dataset", h5::last_error());
  };
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const int li = static_cast<int>(l);
    LayerSets& ls = layers[l];
    reopen(ls.q, layer_path(li, "q"));
    reopen(ls.k, layer_path(li, "k"));
    reopen(ls.v, layer_path(li, "v"));
    reopen(ls.attn, layer_path(li, "attn"));
    reopen(ls.out, layer_path(li, "out"));
    reopen(ls.local, layer_path(li, "local"));
  }
  reopen(labels, "/labels");
  reopen(logits, "/logits");
  reopen(images, "/images");
}

void FileReader::read_image_into(ImageQKV& img, int image, const std::vector<int>& layers_wanted,
                                 bool with_v, bool defer_direct) {
  check_image(image);
  img.heads = schema.max_heads();
  img.layers.clear();
  if (layers_wanted.empty()) {
    for (int l = 0; l < schema.attrs.num_layers; ++l) img.layers.push_back(l);
  } else {
    for (int l : layers_wanted) check_layer(l);
    img.layers = layers_wanted;
  }
  const int stride = img.heads;
  const std::size_t slots = img.layers.size() * static_cast<std::size_t>(stride);
  img.q.resize(slots);
  img.k.resize(slots);
  img.v.resize(slots);
  if (!with_v) {
    for (MatF& v : img.v) v.resize(0, 0);  // empty matrices without with_v
  }
  const int n_sets = with_v ? 3 : 2;
  img.deferred.resize(defer_direct ? img.layers.size() * 3 : 0);
  for (DeferredBlock& b : img.deferred) b.fd = -1;
  for (std::size_t s = 0; s < img.layers.size(); ++s) {
    const int layer = img.layers[s];
    const LayerSets& ls = layers[static_cast<std::size_t>(layer)];
    const LayerGeometry& g = schema.layer_geometry[static_cast<std::size_t>(layer)];
    const int H = g.num_heads, d = g.head_dim;
    const std::pair<const h5::Handle*, std::vector<MatF>*> sets[3] = {
        {&ls.q, &img.q}, {&ls.k, &img.k}, {&ls.v, &img.v}};
    const char* names[3] = {"q", "k", "v"};
    for (int t = 0; t < n_sets; ++t) {
      const LayerShape shape = layer_shape(layer, names[t]);
      const int rows = t == 0 ? g.query_rows() : g.key_rows();
      const std::vector<hsize_t> start(shape.dims.size(), 0);
      const std::vector<const char*> dim_names =
          g.windows > 0 ? std::vector<const char*>{"head", "window", "token", "dim"}
                        : std::vector<const char*>{"head", "token", "dim"};
      std::vector<MatF*> heads;
      for (int h = 0; h < stride; ++h) {
        MatF& m = (*sets[t].second)[s * static_cast<std::size_t>(stride) + static_cast<std::size_t>(h)];
        if (h >= H) {
          m.resize(0, 0);
          continue;
        }
        heads.push_back(&m);
      }
      const auto size_heads = [&] {
        for (MatF* m : heads) m->resize(rows, d);
      };
      const std::string name = layer_path(layer, names[t]);
      // A deferred block's matrices are not even sized here: whoever computes a head reads it
      // into matrices of its own (read_deferred_into) or sizes these (read_deferred), so a
      // buffer's pages are never touched for nothing.
      if (!defer_direct) size_heads();
      if (read_direct(sets[t].first->get(), layers[static_cast<std::size_t>(layer)].direct[t], name, image,
                      shape.dims, dim_names, heads.data(), H, rows, d,
                      defer_direct ? &img.deferred[s * 3 + static_cast<std::size_t>(t)] : nullptr)) {
        continue;
      }
      if (defer_direct) size_heads();  // read through HDF5 below after all
      const float* p = read_block(sets[t].first->get(), name, image, start, shape.dims, dim_names);
      for (int h = 0; h < H; ++h) {
        // MatF is row-major, as the block: one memcpy (Eigen's element loop cost twice as much).
        std::copy_n(p + static_cast<std::ptrdiff_t>(h) * rows * d, static_cast<std::ptrdiff_t>(rows) * d,
                    heads[static_cast<std::size_t>(h)]->data());
      }
    }
  }
}

std::optional<MatF> FileReader::read_head(int image, int layer, int head, const char* name) {
  check_image(image);
  check_layer(layer);
  check_head(layer, head);
  const LayerSets& ls = layers[static_cast<std::size_t>(layer)];
  const bool attn = std::string_view(name) == "attn";
  const h5::Handle& ds = attn ? ls.attn : std::string_view(name) == "out" ? ls.out : ls.local;
  if (!ds.valid()) return std::nullopt;
  const LayerGeometry& g = schema.layer_geometry[static_cast<std::size_t>(layer)];
  LayerShape shape = layer_shape(layer, name);
  std::vector<hsize_t> start(shape.dims.size(), 0);
  start[0] = static_cast<hsize_t>(head);
  shape.dims[0] = 1;
  const auto rows = static_cast<Eigen::Index>(g.query_rows());
  const auto cols = static_cast<Eigen::Index>(attn ? g.unit_keys() : g.head_dim);
  const std::vector<const char*> dim_names =
      g.windows > 0 ? std::vector<const char*>{"head", "window", attn ? "query" : "token", attn ? "key" : "dim"}
                    : std::vector<const char*>{"head", attn ? "query" : "token", attn ? "key" : "dim"};
  const float* p = read_block(ds.get(), layer_path(layer, name), image, start, shape.dims, dim_names);
  return MatF(Eigen::Map<const MatF>(p, rows, cols));
}

VecF FileReader::read_input_image(int image, std::vector<int>* shape) {
  check_image(image);
  const std::vector<hsize_t> dims = h5::dims(images.get());
  const std::vector<hsize_t> count(dims.begin() + 1, dims.end());
  const float* p =
      read_block(images.get(), "/images", image, {0, 0, 0}, count, {"channel", "row", "column"});
  if (shape != nullptr) {
    shape->assign(
        {static_cast<int>(count[0]), static_cast<int>(count[1]), static_cast<int>(count[2])});
  }
  return Eigen::Map<const VecF>(p, static_cast<Eigen::Index>(count[0] * count[1] * count[2]));
}

void FileReader::read_token_masks(const std::string& name, unsigned char* out) const {
  const std::string& path = schema.path;
  const h5::Handle ds = open_dataset(file.get(), name, path);
  const auto n = static_cast<hsize_t>(schema.num_images),
             N = static_cast<hsize_t>(schema.attrs.num_tokens);
  check_shape(ds.get(), name, path, {n, N}, false, "[images, tokens]");
  // One byte per value: unsigned integers, or h5py's bool (an enum over int8). Read as stored, so
  // that no conversion can turn a 2 into a 1.
  const h5::Handle t = h5::type(H5Dget_type(ds.get()));
  bool one_byte = H5Tget_size(t.get()) == 1;
  if (H5Tget_class(t.get()) == H5T_INTEGER) {
    one_byte = one_byte && H5Tget_sign(t.get()) == H5T_SGN_NONE;
  } else if (H5Tget_class(t.get()) == H5T_ENUM) {
    const h5::Handle base = h5::type(H5Tget_super(t.get()));
    one_byte = one_byte && H5Tget_class(base.get()) == H5T_INTEGER;
  } else {
    one_byte = false;
  }
  if (!one_byte) {
    throw InputError(path, name, "dtype bool or uint8 (1 = exclude the token)",
                     h5::describe_type(t.get()));
  }
  if (n * N > 0 && H5Dread(ds.get(), t.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0) {
    throw InputError(path, name, "readable data", h5::last_error());
  }
  for (hsize_t i = 0; i < n * N; ++i) {
    if (out[i] > 1) {
      throw InputError(path, name, "values 0 or 1 (1 = exclude the token)",
                       std::to_string(out[i]) + " at image " + std::to_string(i / N) + ", token " +
                           std::to_string(i % N));
    }
  }
}

namespace {

/// HDF5's chunk cache of a reader when set_chunk_cache is not called.
constexpr std::size_t kDefaultChunkCache = std::size_t{32} << 20;

std::string dtype_name(DType t) { return t == DType::F16 ? "float16" : "float32"; }

std::string bools_text(const std::vector<bool>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::string(v[i] ? "yes" : "no");
  return s + "]";
}

std::string ints_text(const std::vector<int>& v) {
  if (v.empty()) return "absent";
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string double_text(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

/// The name a dump read from several files goes by in messages.
std::string joined_name(const std::vector<std::string>& files) {
  if (files.size() == 1) return files.front();
  if (files.size() > 4) {
    return files.front() + ", ..., " + files.back() + " (" + std::to_string(files.size()) +
           " files)";
  }
  std::string s;
  for (const std::string& f : files) s += (s.empty() ? "" : ", ") + f;
  return s;
}

namespace {

/// A layer's family, feature map and convention as one text (what must agree).
std::string variant_attributes(const DumpSchema& s, int layer) {
  const DumpAttributes& a = static_cast<std::size_t>(layer) < s.layer_attrs.size()
                                ? s.layer_attrs[static_cast<std::size_t>(layer)]
                                : s.attrs;
  return a.attention_family + ":" + a.feature_map + "@" + a.convention;
}

std::vector<int> all_or(const std::vector<int>& layers, int num_layers) {
  if (!layers.empty()) return layers;
  std::vector<int> all;
  for (int l = 0; l < num_layers; ++l) all.push_back(l);
  return all;
}

}  // namespace

/// Refuses `b` unless it holds the same kind of data as `a` (the first file): every attribute an
/// analysis reads, the layers' optional tensors, the dtype, and the optional datasets.
void check_compatible(const FileReader& a, const FileReader& b) {
  const DumpSchema& x = a.schema;
  const DumpSchema& y = b.schema;
  const auto differ = [&](const std::string& what, const std::string& va, const std::string& vb) {
    if (va == vb) return;
    throw InputError(y.path, what,
                     va + " as in " + x.path + " (files read as one dump must agree)", vb);
  };
  const auto attr = [](const char* name) { return std::string("attribute '") + name + "'"; };
  const DumpAttributes& p = x.attrs;
  const DumpAttributes& q = y.attrs;
  differ(attr("model_name"), "'" + p.model_name + "'", "'" + q.model_name + "'");
  differ(attr("attention_family"), p.attention_family, q.attention_family);
  differ(attr("feature_map"), p.feature_map, q.feature_map);
  differ(attr("convention"), p.convention, q.convention);
  differ(attr("scale"), double_text(p.scale), double_text(q.scale));
  differ(attr("num_layers"), std::to_string(p.num_layers), std::to_string(q.num_layers));
  differ(attr("num_heads"), std::to_string(p.num_heads), std::to_string(q.num_heads));
  differ(attr("head_dim"), std::to_string(p.head_dim), std::to_string(q.head_dim));
  differ(attr("num_tokens"), std::to_string(p.num_tokens), std::to_string(q.num_tokens));
  differ(attr("grid_height"), std::to_string(p.grid.height), std::to_string(q.grid.height));
  differ(attr("grid_width"), std::to_string(p.grid.width), std::to_string(q.grid.width));
  differ(attr("prefix_tokens"), std::to_string(p.grid.prefix), std::to_string(q.grid.prefix));
  differ(attr("source_layers"), ints_text(x.source_layers), ints_text(y.source_layers));
  differ("dtype of /layers/*/q, k, v", dtype_name(x.dtype), dtype_name(y.dtype));
  differ("/layers/*/attn (per layer)", bools_text(x.layer_has_attn), bools_text(y.layer_has_attn));
  differ("/layers/*/out (per layer)", bools_text(x.layer_has_out), bools_text(y.layer_has_out));
  differ("/layers/*/local (per layer)", bools_text(x.layer_has_local),
         bools_text(y.layer_has_local));
  for (int l = 0; l < p.num_layers; ++l) {
    differ("/layers/" + std::to_string(l) + " family, feature_map, convention",
           variant_attributes(x, l), variant_attributes(y, l));
    const LayerGeometry gx = x.geometry(l), gy = y.geometry(l);
    if (gx != gy) {
      differ("/layers/" + std::to_string(l) + " geometry", gx.describe(),
             gy.describe() == gx.describe() ? gy.describe() + " (other positions, mask or scale)"
                                            : gy.describe());
    }
  }
  const auto present = [](bool has) { return std::string(has ? "present" : "absent"); };
  differ("/labels", present(x.has_labels), present(y.has_labels));
  differ("/logits", present(x.has_logits), present(y.has_logits));
  differ("/images", present(x.has_images), present(y.has_images));
  if (x.has_logits) {
    differ("/logits classes", std::to_string(h5::dims(a.logits.get()).at(1)),
           std::to_string(h5::dims(b.logits.get()).at(1)));
  }
  if (x.has_images) {
    std::vector<hsize_t> da = h5::dims(a.images.get()), db = h5::dims(b.images.get());
    da.erase(da.begin());
    db.erase(db.begin());
    differ("/images shape [C, H, W]", h5::shape_string(da), h5::shape_string(db));
  }
}

/// Shards of one dump (the dumper's shard_first_image attribute) must follow each other in
/// order: `b`'s first image comes after the last of `a`.
void check_shard_order(const FileReader& a, const FileReader& b) {
  if (a.shard_first_image < 0 || b.shard_first_image < 0) return;
  const long long after = static_cast<long long>(a.shard_first_image) + a.schema.num_images;
  if (b.shard_first_image >= after) return;
  throw InputError(b.schema.path, "attribute 'shard_first_image'",
                   "at least " + std::to_string(after) + ", as the shard given after " +
                       a.schema.path + " (images " + std::to_string(a.shard_first_image) + " to " +
                       std::to_string(after - 1) + "; give the shards in order)",
                   std::to_string(b.shard_first_image));
}

}  // namespace

struct DumpReader::Impl {
  ReadScratch scratch;  // declared first: outlives the files that point to it
  std::vector<std::unique_ptr<FileReader>> files;
  std::vector<int> first;  // the sequence index of each file's first image
  DumpSchema schema;       // the whole sequence
  std::size_t chunk_cache = kDefaultChunkCache;
  std::size_t current = 0;  // the file read last: the only one whose chunk caches may hold data

  void apply_chunk_cache();
  /// The file holding sequence image `image` (range-checked), its local index in `local`; drops
  /// the chunk caches of the file read before when it is another one.
  FileReader& locate(int image, int* local);
};

void DumpReader::Impl::apply_chunk_cache() {
  // Only one file's caches are warm at a time (locate), so the budget is split over the
  // datasets of one file.
  const FileReader& f0 = *files.front();
  std::size_t sets = 3;  // /labels, /logits, /images
  for (std::size_t l = 0; l < f0.layers.size(); ++l) {
    sets += 3 + (f0.schema.layer_has_attn[l] ? 1 : 0) + (f0.schema.layer_has_out[l] ? 1 : 0);
  }
  scratch.dataset_cache = chunk_cache / sets;
  for (auto& f : files) f->reopen_datasets();
}

FileReader& DumpReader::Impl::locate(int image, int* local) {
  if (schema.num_images == 0) {
    throw InputError(schema.path, "/layers/0/q", "at least one image", "no images");
  }
  if (image < 0 || image >= schema.num_images) {
    throw UsageError(schema.path + ": image " + std::to_string(image) + " out of range [0, " +
                     std::to_string(schema.num_images) + ")");
  }
  const std::size_t i =
      static_cast<std::size_t>(std::upper_bound(first.begin(), first.end(), image) - first.begin()) - 1;
  if (i != current) {
    files[current]->reopen_datasets();
    current = i;
  }
  *local = image - first[i];
  return *files[i];
}

DumpReader::DumpReader(const std::string& path)
    : DumpReader(std::vector<std::string>{path}) {}

DumpReader::DumpReader(const std::vector<std::string>& paths) : impl_(std::make_unique<Impl>()) {
  h5::quiet_hdf5();
  if (paths.empty()) throw UsageError("no dump file given");
  Impl& m = *impl_;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    const std::string& p = paths[i];
    // The same file twice (also through another name: a link, ./s.h5) would count its images
    // twice in every total.
    for (std::size_t k = 0; k < i; ++k) {
      std::error_code ec;
      if (std::filesystem::equivalent(paths[k], p, ec) && !ec) {
        throw UsageError("--dump: " + p + " is given twice" + (paths[k] == p ? "" : " (also as " + paths[k] + ")") +
                         ": its images would be counted twice");
      }
    }
    m.files.push_back(std::make_unique<FileReader>(p, m.scratch));
    if (m.files.size() > 1) {
      check_compatible(*m.files.front(), *m.files.back());
      check_shard_order(*m.files[m.files.size() - 2], *m.files.back());
    }
  }
  m.schema = m.files.front()->schema;
  m.schema.files = paths;
  m.schema.path = joined_name(paths);
  m.schema.num_images = 0;
  m.schema.file_images.clear();
  for (std::size_t i = 0; i < m.files.size(); ++i) {
    const FileReader& f = *m.files[i];
    m.first.push_back(m.schema.num_images);
    m.schema.file_images.push_back(f.schema.num_images);
    m.schema.num_images += f.schema.num_images;
    if (i > 0) {
      m.schema.warnings.insert(m.schema.warnings.end(), f.schema.warnings.begin(),
                               f.schema.warnings.end());
    }
  }
  m.apply_chunk_cache();
}

DumpReader::~DumpReader() = default;

const DumpSchema& DumpReader::schema() const { return impl_->schema; }

void DumpReader::set_chunk_cache(std::size_t bytes) {
  h5::quiet_hdf5();
  impl_->chunk_cache = bytes;
  impl_->apply_chunk_cache();
}

std::size_t DumpReader::chunk_cache() const { return impl_->chunk_cache; }

std::size_t DumpReader::direct_reads() const {
  std::size_t n = 0;
  for (const auto& f : impl_->files) n += f->direct_blocks;
  return n;
}

std::size_t read_buffer_bytes(const DumpAttributes& a) {
  const auto H = static_cast<std::size_t>(a.num_heads), N = static_cast<std::size_t>(a.num_tokens),
             d = static_cast<std::size_t>(a.head_dim);
  // The largest block read at once: one layer's q, k or v, or one head's attn.
  const std::size_t block = std::max(H * N * d, N * N);
  return block * (sizeof(float) + sizeof(std::uint16_t));
}

std::size_t read_buffer_bytes(const DumpSchema& s) {
  std::size_t most = read_buffer_bytes(s.attrs);
  for (const LayerGeometry& g : s.layer_geometry) {
    const auto H = static_cast<std::size_t>(g.num_heads), d = static_cast<std::size_t>(g.head_dim);
    const std::size_t block = std::max({H * static_cast<std::size_t>(g.query_rows()) * d,
                                        H * static_cast<std::size_t>(g.key_rows()) * d,
                                        static_cast<std::size_t>(g.query_rows()) * g.unit_keys()});
    most = std::max(most, block * (sizeof(float) + sizeof(std::uint16_t)));
  }
  return most;
}

LayerGeometry DumpSchema::geometry(int layer) const {
  if (layer < 0 || static_cast<std::size_t>(layer) >= layer_geometry.size()) {
    return dump_detail::root_geometry(attrs);
  }
  return layer_geometry[static_cast<std::size_t>(layer)];
}

bool DumpSchema::geometry_differs(int layer) const {
  const LayerGeometry root = dump_detail::root_geometry(attrs);
  if (layer >= 0) return geometry(layer) != root;
  return std::any_of(layer_geometry.begin(), layer_geometry.end(),
                     [&root](const LayerGeometry& g) { return g != root; });
}

int DumpSchema::max_heads() const {
  int most = attrs.num_heads;
  for (const LayerGeometry& g : layer_geometry) most = std::max(most, g.num_heads);
  return most;
}

void set_dump_warning_handler(std::function<void(const std::string&)> handler) {
  std::lock_guard<std::mutex> lock(warning_mutex);
  warning_handler() = std::move(handler);
}

std::pair<const std::string*, long> DumpSchema::image_file(int image) const {
  long first = 0;
  for (std::size_t f = 0; f < files.size() && f < file_images.size(); ++f) {
    if (image < first + file_images[f]) return {&files[f], image - first};
    first += file_images[f];
  }
  return {files.empty() ? &path : &files.front(), image};
}

int DumpSchema::model_layer(int layer) const {
  if (layer < 0 || static_cast<std::size_t>(layer) >= source_layers.size()) return layer;
  return source_layers[static_cast<std::size_t>(layer)];
}

int DumpSchema::dump_layer(int model_layer_index) const {
  if (source_layers.empty()) return model_layer_index;
  const auto it = std::find(source_layers.begin(), source_layers.end(), model_layer_index);
  return it == source_layers.end() ? -1 : static_cast<int>(it - source_layers.begin());
}

ImageQKV DumpReader::read_image(int image, const std::vector<int>& layers, bool with_v) {
  ImageQKV img;
  read_image_into(img, image, layers, with_v);
  return img;
}

void DumpReader::read_image_into(ImageQKV& img, int image, const std::vector<int>& layers,
                                 bool with_v, bool defer_direct) {
  h5::quiet_hdf5();
  int local = 0;
  impl_->locate(image, &local).read_image_into(img, local, layers, with_v, defer_direct);
  img.image = image;
}

unsigned ImageQKV::read_deferred_into(int slot, int head, MatF* const to[3]) const {
  if (deferred.empty()) return 0;
  unsigned read = 0;
  for (std::size_t t = 0; t < 3; ++t) {
    const DeferredBlock& b = deferred[static_cast<std::size_t>(slot) * 3 + t];
    // (A head past the layer's own, dims[0], has nothing to read: its matrices stay 0 x 0.)
    if (b.fd < 0 || static_cast<std::uint64_t>(head) >= b.dims.front()) continue;
    // One head: rows x head_dim floats (the last axis), windows one after another.
    const auto cols = static_cast<Eigen::Index>(b.dims.back());
    to[t]->resize(static_cast<Eigen::Index>(b.head_bytes / sizeof(float)) / cols, cols);
    read_head_at(b.fd, *to[t], b.offset + static_cast<std::uint64_t>(head) * b.head_bytes, head,
                 {b.dims.begin(), b.dims.end()}, b.dim_names, *b.file, b.dataset, b.image);
    read |= 1U << t;
  }
  return read;
}

void ImageQKV::read_deferred(int slot, int head) {
  const std::size_t at =
      static_cast<std::size_t>(slot) * static_cast<std::size_t>(heads) + static_cast<std::size_t>(head);
  MatF* const to[3] = {&q[at], &k[at], &v[at]};
  read_deferred_into(slot, head, to);
}

std::optional<MatF> DumpReader::read_attn(int image, int layer, int head) {
  h5::quiet_hdf5();
  int local = 0;
  return impl_->locate(image, &local).read_head(local, layer, head, "attn");
}

std::optional<MatF> DumpReader::read_out(int image, int layer, int head) {
  h5::quiet_hdf5();
  int local = 0;
  return impl_->locate(image, &local).read_head(local, layer, head, "out");
}

std::optional<MatF> DumpReader::read_local(int image, int layer, int head) {
  h5::quiet_hdf5();
  int local = 0;
  return impl_->locate(image, &local).read_head(local, layer, head, "local");
}

Variant DumpSchema::layer_variant(int layer, std::uint64_t seed) const {
  if (layer < 0 || static_cast<std::size_t>(layer) >= layer_attrs.size()) {
    return attrs.variant(seed);
  }
  return layer_attrs[static_cast<std::size_t>(layer)].variant(seed);
}

bool DumpSchema::variants_differ(const std::vector<int>& layers) const {
  const std::vector<int> all = all_or(layers, attrs.num_layers);
  return std::any_of(all.begin(), all.end(), [&](int l) {
    return variant_attributes(*this, l) != variant_attributes(*this, all.front());
  });
}

std::string DumpSchema::layer_variants_text(const std::vector<int>& layers) const {
  std::string out;
  for (int l : all_or(layers, attrs.num_layers)) {
    out +=
        (out.empty() ? "" : ", ") + std::to_string(model_layer(l)) + ": " + layer_variant(l).name();
  }
  return out;
}

std::vector<std::int64_t> DumpReader::read_labels() {
  h5::quiet_hdf5();
  Impl& m = *impl_;
  if (!m.schema.has_labels) return {};
  std::vector<std::int64_t> out(static_cast<std::size_t>(m.schema.num_images));
  for (std::size_t i = 0; i < m.files.size(); ++i) {
    const FileReader& f = *m.files[i];
    if (f.schema.num_images > 0 &&
        H5Dread(f.labels.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                out.data() + m.first[i]) < 0) {
      throw InputError(f.schema.path, "/labels", "readable data", h5::last_error());
    }
  }
  return out;
}

namespace {

/// Reads a whole float dataset of shape [images, ...] as images x (product of the rest).
MatF read_whole(hid_t ds, const std::string& name, const std::string& path, int images) {
  const std::vector<hsize_t> dims = h5::dims(ds);
  hsize_t cols = 1;
  for (std::size_t i = 1; i < dims.size(); ++i) cols *= dims[i];
  MatF out(images, static_cast<Eigen::Index>(cols));
  const h5::Handle half = h5::half_type();
  std::vector<std::uint16_t> scratch;
  if (out.size() > 0) {
    const std::string why = read_floats(ds, H5S_ALL, H5S_ALL, out.data(),
                                        static_cast<std::size_t>(out.size()), half.get(), scratch);
    if (!why.empty()) throw InputError(path, name, "readable data", why);
  }
  for (Eigen::Index i = 0; i < out.rows(); ++i) {
    check_finite(out.row(i).data(), {0}, {cols}, {"element"}, path, name, static_cast<int>(i));
  }
  return out;
}

/// The whole dataset `which` of every file, stacked in file order.
MatF read_stacked(const std::vector<std::unique_ptr<FileReader>>& files,
                  h5::Handle FileReader::*which, const std::string& name) {
  MatF all;
  for (const auto& f : files) {
    MatF part = read_whole((f.get()->*which).get(), name, f->schema.path, f->schema.num_images);
    if (files.size() == 1) return part;
    MatF grown(all.rows() + part.rows(), part.cols());
    if (all.rows() > 0) grown.topRows(all.rows()) = all;
    grown.bottomRows(part.rows()) = part;
    all = std::move(grown);
  }
  return all;
}

}  // namespace

MatF DumpReader::read_logits() {
  h5::quiet_hdf5();
  Impl& m = *impl_;
  if (!m.schema.has_logits) return {};
  return read_stacked(m.files, &FileReader::logits, "/logits");
}

MatF DumpReader::read_images(std::vector<int>* shape) {
  h5::quiet_hdf5();
  Impl& m = *impl_;
  if (!m.schema.has_images) return {};
  if (shape != nullptr) {
    const std::vector<hsize_t> dims = h5::dims(m.files.front()->images.get());
    shape->assign(
        {static_cast<int>(dims[1]), static_cast<int>(dims[2]), static_cast<int>(dims[3])});
  }
  return read_stacked(m.files, &FileReader::images, "/images");
}

VecF DumpReader::read_input_image(int image, std::vector<int>* shape) {
  h5::quiet_hdf5();
  Impl& m = *impl_;
  if (!m.schema.has_images) {
    throw InputError(m.schema.path, "/images", "a dataset [images, C, H, W] (the model's input)",
                     "none");
  }
  int local = 0;
  return m.locate(image, &local).read_input_image(local, shape);
}

std::vector<unsigned char> DumpReader::read_token_masks(const std::string& name) {
  h5::quiet_hdf5();
  Impl& m = *impl_;
  if (name.empty() || name == "/") throw UsageError("a token mask needs a dataset name");
  const std::string path = name.front() == '/' ? name : "/" + name;
  const auto N = static_cast<std::size_t>(m.schema.attrs.num_tokens);
  std::vector<unsigned char> out(static_cast<std::size_t>(m.schema.num_images) * N);
  for (std::size_t i = 0; i < m.files.size(); ++i) {
    m.files[i]->read_token_masks(path, out.data() + static_cast<std::size_t>(m.first[i]) * N);
  }
  return out;
}

std::vector<DatasetInfo> DumpReader::datasets() const {
  h5::quiet_hdf5();
  std::vector<DatasetInfo> out;
  for (const auto& fp : impl_->files) {
    const FileReader& m = *fp;
    // With several files each dataset's name says which file holds it.
    const std::string prefix = impl_->files.size() > 1 ? m.schema.path + ":" : "";
    std::vector<std::pair<std::string, hid_t>> all;
    for (std::size_t l = 0; l < m.layers.size(); ++l) {
      const LayerSets& ls = m.layers[l];
      const std::pair<const char*, const h5::Handle*> sets[6] = {
          {"q", &ls.q},       {"k", &ls.k},     {"v", &ls.v},
          {"attn", &ls.attn}, {"out", &ls.out}, {"local", &ls.local}};
      for (const auto& [name, h] : sets) {
        if (h->valid()) all.emplace_back(layer_path(static_cast<int>(l), name), h->get());
      }
    }
    if (m.labels.valid()) all.emplace_back("/labels", m.labels.get());
    if (m.logits.valid()) all.emplace_back("/logits", m.logits.get());
    if (m.images.valid()) all.emplace_back("/images", m.images.get());
    for (const auto& [name, ds] : all) {
      DatasetInfo info;
      info.name = prefix + name;
      for (hsize_t x : h5::dims(ds)) info.shape.push_back(x);
      h5::Handle t = h5::type(H5Dget_type(ds));
      info.dtype = h5::describe_type(t.get());
      h5::Handle dcpl = h5::plist(H5Dget_create_plist(ds));
      if (H5Pget_layout(dcpl.get()) == H5D_CHUNKED) {
        std::vector<hsize_t> c(info.shape.size());
        H5Pget_chunk(dcpl.get(), static_cast<int>(c.size()), c.data());
        for (hsize_t x : c) info.chunks.push_back(x);
      }
      info.filters = filters_of(dcpl.get());
      out.push_back(std::move(info));
    }
  }
  return out;
}

}  // namespace attnscope
