// DumpWriter: writes a v1 dump as h5py would (same types, one image per chunk), under a temporary
// name that is renamed into place only when close() succeeds.
#include "dump_internal.hpp"
#include "hdf5_util.hpp"

#include "attnscope/error.hpp"

#include <unistd.h>

#include <filesystem>

namespace attnscope {

using dump_detail::layer_path;

namespace {

enum Kind { kQ, kK, kV, kAttn, kOut, kKinds };
constexpr const char* kKindName[kKinds] = {"q", "k", "v", "attn", "out"};

}  // namespace

struct DumpWriter::Impl {
  std::string path, tmp;
  DumpAttributes attrs;
  DumpWriterOptions opts;
  h5::Handle half;
  h5::Handle file;               // declared before the datasets: closed after them
  std::vector<h5::Handle> sets;  // index layer * kKinds + kind
  h5::Handle labels, logits, images;
  hsize_t n_images = 0;
  bool closed = false;
  std::vector<float> fbuf;
  std::vector<std::uint16_t> hbuf;

  [[nodiscard]] hid_t file_type() const {
    return opts.dtype == DType::F16 ? half.get() : H5T_IEEE_F32LE;
  }
  h5::Handle create(const std::string& name, hid_t type, const std::vector<hsize_t>& dims,
                    const std::vector<hsize_t>& chunk, bool extensible);
  void create_layers();
  void write_image_block(hid_t ds, const std::string& name, const std::vector<hsize_t>& count);
  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  /// Not closed (an exception, even one from DumpWriter's constructor): close the HDF5 objects
  /// and remove the temporary file, so no half-written dump is left.
  ~Impl() {
    if (closed) return;
    sets.clear();
    labels.reset();
    logits.reset();
    images.reset();
    file.reset();
    std::error_code ec;
    if (!tmp.empty()) std::filesystem::remove(tmp, ec);  // nothing to report from a destructor
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(path + ": cannot write the dump: " + what);
  }
};

h5::Handle DumpWriter::Impl::create(const std::string& name, hid_t type,
                                    const std::vector<hsize_t>& dims,
                                    const std::vector<hsize_t>& chunk, bool extensible) {
  std::vector<hsize_t> maxdims(dims);
  if (extensible) maxdims[0] = H5S_UNLIMITED;
  h5::Handle space =
      h5::space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), maxdims.data()));
  h5::Handle dcpl = h5::plist(H5Pcreate(H5P_DATASET_CREATE));
  if (!chunk.empty()) {
    H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data());
    if (opts.compression > 0) {
      H5Pset_shuffle(dcpl.get());
      H5Pset_deflate(dcpl.get(), static_cast<unsigned>(opts.compression));
    }
  }
  h5::Handle lcpl = h5::plist(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  h5::Handle ds = h5::dataset(
      H5Dcreate2(file.get(), name.c_str(), type, space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT));
  if (!ds.valid()) fail("creating " + name + ": " + h5::last_error());
  return ds;
}

void DumpWriter::Impl::create_layers() {
  const auto H = static_cast<hsize_t>(attrs.num_heads), N = static_cast<hsize_t>(attrs.num_tokens),
             d = static_cast<hsize_t>(attrs.head_dim);
  for (int l = 0; l < attrs.num_layers; ++l) {
    for (int k = 0; k < kKinds; ++k) {
      const bool wanted =
          k < kAttn || (k == kAttn && opts.with_attn) || (k == kOut && opts.with_out);
      if (!wanted) {
        sets.emplace_back();
        continue;
      }
      const std::vector<hsize_t> chunk{1, H, N, k == kAttn ? N : d};
      std::vector<hsize_t> dims(chunk);
      dims[0] = 0;
      sets.push_back(create(layer_path(l, kKindName[k]), file_type(), dims, chunk, true));
    }
  }
}

/// Appends fbuf (count = [H, N, x] floats) as image n_images of dataset ds.
void DumpWriter::Impl::write_image_block(hid_t ds, const std::string& name,
                                         const std::vector<hsize_t>& count) {
  std::vector<hsize_t> dims{n_images + 1}, off{n_images, 0, 0, 0}, cnt{1};
  dims.insert(dims.end(), count.begin(), count.end());
  cnt.insert(cnt.end(), count.begin(), count.end());
  if (H5Dset_extent(ds, dims.data()) < 0) fail("extending " + name + ": " + h5::last_error());
  const auto total = static_cast<hsize_t>(fbuf.size());
  h5::Handle fs = h5::space(H5Dget_space(ds));
  h5::Handle ms = h5::space(H5Screate_simple(1, &total, nullptr));
  H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, off.data(), nullptr, cnt.data(), nullptr);
  herr_t rc = 0;
  if (opts.dtype == DType::F16) {
    // Rounded here, ties to even like numpy, rather than by HDF5's conversion path.
    hbuf.resize(fbuf.size());
    for (std::size_t i = 0; i < fbuf.size(); ++i) {
      hbuf[i] = dump_detail::float_to_half(fbuf[i]);
      if (std::isfinite(fbuf[i]) && (hbuf[i] & 0x7c00U) == 0x7c00U) {
        throw NumericalError(path + ": " + name + ": value " + std::to_string(fbuf[i]) +
                             " at image " + std::to_string(n_images) +
                             " overflows float16 (max 65504)");
      }
    }
    rc = H5Dwrite(ds, half.get(), ms.get(), fs.get(), H5P_DEFAULT, hbuf.data());
  } else {
    rc = H5Dwrite(ds, H5T_NATIVE_FLOAT, ms.get(), fs.get(), H5P_DEFAULT, fbuf.data());
  }
  if (rc < 0) fail("writing " + name + ": " + h5::last_error());
}

DumpWriter::DumpWriter(const std::string& path, const DumpAttributes& attrs,
                       const DumpWriterOptions& opts)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = path;
  m.attrs = attrs;
  m.opts = opts;
  dump_detail::validate_attributes(attrs, path);
  if (opts.compression < 0 || opts.compression > 9) {
    throw UsageError("compression must be a gzip level 0-9, got " +
                     std::to_string(opts.compression));
  }
  h5::quiet_hdf5();
  m.half = h5::half_type();
  m.tmp = path + ".tmp-" + std::to_string(static_cast<long>(::getpid()));
  const h5::Handle fapl = h5::small_metadata_cache_fapl();  // memory flat whatever the size
  m.file = h5::file(H5Fcreate(m.tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
  if (!m.file.valid()) {
    throw InputError(path, "", "a writable location",
                     "cannot create " + m.tmp + " (" + h5::last_error() + ")");
  }
  h5::Handle root = h5::group(H5Gopen2(m.file.get(), "/", H5P_DEFAULT));
  dump_detail::write_attributes(root.get(), attrs);
  m.create_layers();
}

DumpWriter::~DumpWriter() = default;  // Impl's destructor removes an unclosed temporary file

void DumpWriter::append(const ImageQKV& img, const std::vector<MatF>* attn,
                        const std::vector<MatF>* out) {
  h5::quiet_hdf5();  // this thread too (silencing is per thread)
  Impl& m = *impl_;
  const DumpAttributes& a = m.attrs;
  const int L = a.num_layers, H = a.num_heads, N = a.num_tokens, d = a.head_dim;
  const auto slots = static_cast<std::size_t>(L) * static_cast<std::size_t>(H);
  bool ok = img.heads == H && img.layers.size() == static_cast<std::size_t>(L) &&
            img.q.size() == slots && img.k.size() == slots && img.v.size() == slots;
  for (int l = 0; ok && l < L; ++l) ok = img.layers[static_cast<std::size_t>(l)] == l;
  if (!ok) m.fail("append() needs every layer in order with num_heads heads");
  if (m.opts.with_attn && (attn == nullptr || attn->size() != slots)) m.fail("append() needs attn");
  if (m.opts.with_out && (out == nullptr || out->size() != slots)) m.fail("append() needs out");

  for (int l = 0; l < L; ++l) {
    for (int k = 0; k < kKinds; ++k) {
      const h5::Handle& ds = m.sets[static_cast<std::size_t>(l * kKinds + k)];
      if (!ds.valid()) continue;
      const std::vector<MatF>& src = k == kQ      ? img.q
                                     : k == kK    ? img.k
                                     : k == kV    ? img.v
                                     : k == kAttn ? *attn
                                                  : *out;
      const int cols = k == kAttn ? N : d;
      m.fbuf.resize(static_cast<std::size_t>(H) * static_cast<std::size_t>(N) *
                    static_cast<std::size_t>(cols));
      for (int h = 0; h < H; ++h) {
        const MatF& x = src[static_cast<std::size_t>(l * H + h)];
        if (x.rows() != N || x.cols() != cols) {
          m.fail(layer_path(l, kKindName[k]) + " head " + std::to_string(h) + " is " +
                 std::to_string(x.rows()) + " x " + std::to_string(x.cols()) + ", expected " +
                 std::to_string(N) + " x " + std::to_string(cols));
        }
        Eigen::Map<MatF>(m.fbuf.data() + static_cast<std::ptrdiff_t>(h) * N * cols, N, cols) = x;
      }
      m.write_image_block(
          ds.get(), layer_path(l, kKindName[k]),
          {static_cast<hsize_t>(H), static_cast<hsize_t>(N), static_cast<hsize_t>(cols)});
    }
  }
  ++m.n_images;
}

namespace {

void write_all(hid_t ds, hid_t mem_type, const void* data, const std::string& what) {
  if (H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
    throw Error("cannot write " + what + ": " + h5::last_error());
  }
}

}  // namespace

void DumpWriter::set_labels(const std::vector<std::int64_t>& labels) {
  Impl& m = *impl_;
  m.labels = m.create("/labels", H5T_STD_I64LE, {static_cast<hsize_t>(labels.size())}, {}, false);
  if (!labels.empty()) write_all(m.labels.get(), H5T_NATIVE_INT64, labels.data(), "/labels");
}

void DumpWriter::set_logits(const MatF& logits) {
  Impl& m = *impl_;
  m.logits = m.create("/logits", H5T_IEEE_F32LE,
                      {static_cast<hsize_t>(logits.rows()), static_cast<hsize_t>(logits.cols())},
                      {}, false);
  if (logits.size() > 0) write_all(m.logits.get(), H5T_NATIVE_FLOAT, logits.data(), "/logits");
}

void DumpWriter::set_images(const MatF& images, const std::vector<int>& shape) {
  Impl& m = *impl_;
  if (shape.size() != 3 ||
      static_cast<Eigen::Index>(shape[0]) * shape[1] * shape[2] != images.cols()) {
    m.fail("set_images() needs shape (C, H, W) with C*H*W == images.cols()");
  }
  const std::vector<hsize_t> dims{static_cast<hsize_t>(images.rows()),
                                  static_cast<hsize_t>(shape[0]), static_cast<hsize_t>(shape[1]),
                                  static_cast<hsize_t>(shape[2])};
  std::vector<hsize_t> chunk(dims);
  chunk[0] = 1;
  m.images = m.create("/images", H5T_IEEE_F32LE, dims,
                      images.rows() > 0 ? chunk : std::vector<hsize_t>{}, false);
  if (images.size() > 0) write_all(m.images.get(), H5T_NATIVE_FLOAT, images.data(), "/images");
}

void DumpWriter::close() {
  Impl& m = *impl_;
  if (m.closed) return;
  const std::pair<const h5::Handle*, const char*> optional[3] = {
      {&m.labels, "/labels"}, {&m.logits, "/logits"}, {&m.images, "/images"}};
  for (const auto& [h, name] : optional) {
    if (h->valid() && h5::dims(h->get())[0] != m.n_images) {
      m.fail(std::string(name) + " has " + std::to_string(h5::dims(h->get())[0]) + " rows but " +
             std::to_string(m.n_images) + " images were appended");
    }
  }
  if (H5Fflush(m.file.get(), H5F_SCOPE_GLOBAL) < 0) m.fail("flush: " + h5::last_error());
  m.sets.clear();
  m.labels.reset();
  m.logits.reset();
  m.images.reset();
  if (H5Fclose(m.file.release()) < 0) m.fail("close: " + h5::last_error());
  std::error_code ec;
  std::filesystem::rename(m.tmp, m.path, ec);
  if (ec) m.fail("renaming " + m.tmp + " into place: " + ec.message());
  m.closed = true;
}

}  // namespace attnscope
