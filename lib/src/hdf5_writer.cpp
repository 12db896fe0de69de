// Hdf5Writer (hdf5_writer.hpp): float64 matrices and their attributes, one HDF5 file.
#include "attnscope/hdf5_writer.hpp"

#include "hdf5_util.hpp"

#include "attnscope/error.hpp"

namespace attnscope {

struct Hdf5Writer::Impl {
  std::string name;  // the display name errors start with
  h5::Handle file;
  h5::Handle lcpl;  // link creation: missing groups are created
  // Object creation without modification times, so that the same content gives the same bytes.
  h5::Handle dcpl, gcpl;

  /// Creates the groups on the way to `path` that do not exist yet (times not tracked).
  void create_groups(const std::string& path) const {
    for (std::size_t slash = path.find('/', 1); slash != std::string::npos;
         slash = path.find('/', slash + 1)) {
      const std::string group = path.substr(0, slash);
      const htri_t exists = H5Lexists(file.get(), group.c_str(), H5P_DEFAULT);
      if (exists < 0) fail(group, "cannot create");
      if (exists > 0) continue;
      h5::Handle g = h5::group(H5Gcreate2(file.get(), group.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT));
      if (!g.valid() || H5Gclose(g.release()) < 0) fail(group, "cannot create");
    }
  }

  [[noreturn]] void fail(const std::string& object, const std::string& what) const {
    std::string m = name;
    if (!object.empty()) m += ": " + object;
    throw Error(m + ": " + what + ": " + h5::system_reason());
  }

  void int_attribute(hid_t obj, const std::string& attr, int v, const std::string& where) const {
    const h5::Handle space = h5::space(H5Screate(H5S_SCALAR));
    h5::Handle a = h5::attr(
        H5Acreate2(obj, attr.c_str(), H5T_STD_I32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT));
    if (!a.valid() || H5Awrite(a.get(), H5T_NATIVE_INT, &v) < 0 || H5Aclose(a.release()) < 0) {
      fail(where, "cannot write attribute " + attr);
    }
  }

  void doubles_attribute(hid_t obj, const std::string& attr, const std::vector<double>& v,
                         const std::string& where) const {
    const hsize_t n = v.size();
    const h5::Handle space = h5::space(n ? H5Screate_simple(1, &n, nullptr) : H5Screate(H5S_NULL));
    h5::Handle a = h5::attr(
        H5Acreate2(obj, attr.c_str(), H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT));
    if (!a.valid() || (n && H5Awrite(a.get(), H5T_NATIVE_DOUBLE, v.data()) < 0) ||
        H5Aclose(a.release()) < 0) {
      fail(where, "cannot write attribute " + attr);
    }
  }

  void attributes(hid_t obj, const Hdf5Attributes& attrs, const std::string& where) const {
    for (const auto& [attr, v] : attrs.ints) int_attribute(obj, attr, v, where);
    for (const auto& [attr, v] : attrs.doubles) doubles_attribute(obj, attr, v, where);
  }
};

Hdf5Writer::Hdf5Writer(const std::filesystem::path& path, std::string display_name)
    : impl_(std::make_unique<Impl>()) {
  h5::quiet_hdf5();
  Impl& m = *impl_;
  m.name = std::move(display_name);
  m.file = h5::file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  if (!m.file.valid()) m.fail("", "cannot create");
  m.lcpl = h5::plist(H5Pcreate(H5P_LINK_CREATE));
  if (!m.lcpl.valid() || H5Pset_create_intermediate_group(m.lcpl.get(), 1) < 0) {
    m.fail("", "cannot create");
  }
  m.dcpl = h5::plist(H5Pcreate(H5P_DATASET_CREATE));
  m.gcpl = h5::plist(H5Pcreate(H5P_GROUP_CREATE));
  if (!m.dcpl.valid() || !m.gcpl.valid() || H5Pset_obj_track_times(m.dcpl.get(), false) < 0 ||
      H5Pset_obj_track_times(m.gcpl.get(), false) < 0) {
    m.fail("", "cannot create");
  }
}

// One attempt each, by the handles: HDF5 must never be asked to close a file twice (a second
// H5Fclose after a failed one crashes inside the library), and close() releases what it closed.
Hdf5Writer::~Hdf5Writer() = default;

void Hdf5Writer::write_matrix(const std::string& name, const MatD& mat,
                              const Hdf5Attributes& attributes) {
  h5::quiet_hdf5();
  const Impl& m = *impl_;
  if (!m.file.valid()) m.fail(name, "cannot write to a closed file");
  const hsize_t dims[2] = {static_cast<hsize_t>(mat.rows()), static_cast<hsize_t>(mat.cols())};
  const h5::Handle space = h5::space(H5Screate_simple(2, dims, nullptr));
  if (!space.valid()) m.fail(name, "cannot create");
  if (!name.empty() && name.front() == '/') m.create_groups(name);
  h5::Handle ds = h5::dataset(H5Dcreate2(m.file.get(), name.c_str(), H5T_IEEE_F64LE, space.get(),
                                         m.lcpl.get(), m.dcpl.get(), H5P_DEFAULT));
  if (!ds.valid()) m.fail(name, "cannot create");
  // MatD is row-major: its storage is the dataset's C order.
  if (H5Dwrite(ds.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, mat.data()) < 0) {
    m.fail(name, "cannot write");
  }
  m.attributes(ds.get(), attributes, name);
  if (H5Dclose(ds.release()) < 0) m.fail(name, "cannot write");
}

void Hdf5Writer::write_root_attributes(const Hdf5Attributes& attributes) {
  h5::quiet_hdf5();
  const Impl& m = *impl_;
  if (!m.file.valid()) m.fail("/", "cannot write to a closed file");
  m.attributes(m.file.get(), attributes, "/");
}

void Hdf5Writer::close() {
  h5::quiet_hdf5();
  Impl& m = *impl_;
  m.lcpl.reset();
  m.dcpl.reset();
  m.gcpl.reset();
  if (!m.file.valid()) return;
  const bool flushed = H5Fflush(m.file.get(), H5F_SCOPE_GLOBAL) >= 0;
  const std::string reason = flushed ? std::string() : h5::system_reason();
  // Given up before the call: whatever H5Fclose answers, the identifier is not used again.
  const bool closed = H5Fclose(m.file.release()) >= 0;
  if (!flushed) throw Error(m.name + ": cannot write: " + reason);
  if (!closed) m.fail("", "cannot write");
}

}  // namespace attnscope
