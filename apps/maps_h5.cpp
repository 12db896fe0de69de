#include "maps_h5.hpp"

#include "attnscope/error.hpp"

#include <utility>

namespace attnscope::app {
namespace {

/// Closes an HDF5 object when it goes out of scope (datasets, dataspaces, attributes).
class Id {
 public:
  Id(hid_t id, herr_t (*closer)(hid_t)) : id_(id), closer_(closer) {}
  ~Id() {
    if (id_ >= 0) closer_(id_);
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  [[nodiscard]] hid_t get() const { return id_; }
  [[nodiscard]] bool ok() const { return id_ >= 0; }
  /// Closes now and says whether the close succeeded.
  bool close() { return closer_(std::exchange(id_, -1)) >= 0; }

 private:
  hid_t id_;
  herr_t (*closer_)(hid_t);
};

herr_t keep_message(unsigned /*n*/, const H5E_error2_t* err, void* data) {
  if (err->desc != nullptr && err->desc[0] != '\0') *static_cast<std::string*>(data) = err->desc;
  return 0;
}

/// HDF5's most specific message, shortened to the system's reason when it quotes one (a failed
/// write says "... errno = 28, error message = 'No space left on device', ...").
std::string hdf5_reason() {
  std::string msg;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, keep_message, &msg);
  H5Eclear2(H5E_DEFAULT);
  const std::string key = "error message = '";
  const std::size_t at = msg.find(key);
  if (at != std::string::npos) {
    const std::size_t end = msg.find('\'', at + key.size());
    if (end != std::string::npos) return msg.substr(at + key.size(), end - at - key.size());
  }
  return msg.empty() ? std::string("HDF5 error") : msg;
}

}  // namespace

MapsH5::MapsH5(const std::filesystem::path& staged, std::filesystem::path final_name)
    : final_(std::move(final_name)) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  file_ = H5Fcreate(staged.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file_ < 0) fail("", "cannot create");
  lcpl_ = H5Pcreate(H5P_LINK_CREATE);
  if (lcpl_ < 0 || H5Pset_create_intermediate_group(lcpl_, 1) < 0) fail("", "cannot create");
}

MapsH5::~MapsH5() {
  // One attempt each: HDF5 must never be asked to close a file twice (a second H5Fclose after a
  // failed one crashes inside the library).
  if (lcpl_ >= 0) H5Pclose(std::exchange(lcpl_, -1));
  if (file_ >= 0) H5Fclose(std::exchange(file_, -1));
}

void MapsH5::fail(const std::string& object, const std::string& what) const {
  std::string m = final_.string();
  if (!object.empty()) m += ": " + object;
  throw Error(m + ": " + what + ": " + hdf5_reason());
}

void MapsH5::write_map(const std::string& name, const analyses::AttentionMap& m) {
  const hsize_t dims[2] = {static_cast<hsize_t>(m.grid.rows()), static_cast<hsize_t>(m.grid.cols())};
  const Id space(H5Screate_simple(2, dims, nullptr), H5Sclose);
  if (!space.ok()) fail(name, "cannot create");
  Id ds(H5Dcreate2(file_, name.c_str(), H5T_IEEE_F64LE, space.get(), lcpl_, H5P_DEFAULT, H5P_DEFAULT),
        H5Dclose);
  if (!ds.ok()) fail(name, "cannot create");
  if (H5Dwrite(ds.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, m.grid.data()) < 0) {
    fail(name, "cannot write");
  }
  int_attr(ds.get(), "token", m.token, name);
  int_attr(ds.get(), "query_row", m.query_row, name);
  int_attr(ds.get(), "query_col", m.query_col, name);
  double_attr(ds.get(), "prefix_weights", m.prefix, name);
  if (!ds.close()) fail(name, "cannot write");
}

void MapsH5::root_int(const char* name, int v) { int_attr(file_, name, v, "/"); }

void MapsH5::int_attr(hid_t obj, const char* name, int v, const std::string& where) const {
  const Id space(H5Screate(H5S_SCALAR), H5Sclose);
  Id a(H5Acreate2(obj, name, H5T_STD_I32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!a.ok() || H5Awrite(a.get(), H5T_NATIVE_INT, &v) < 0 || !a.close()) {
    fail(where, std::string("cannot write attribute ") + name);
  }
}

void MapsH5::double_attr(hid_t obj, const char* name, const std::vector<double>& v,
                         const std::string& where) const {
  const hsize_t n = v.size();
  const Id space(n ? H5Screate_simple(1, &n, nullptr) : H5Screate(H5S_NULL), H5Sclose);
  Id a(H5Acreate2(obj, name, H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!a.ok() || (n && H5Awrite(a.get(), H5T_NATIVE_DOUBLE, v.data()) < 0) || !a.close()) {
    fail(where, std::string("cannot write attribute ") + name);
  }
}

void MapsH5::close() {
  if (lcpl_ >= 0) H5Pclose(std::exchange(lcpl_, -1));
  if (file_ < 0) return;
  const bool flushed = H5Fflush(file_, H5F_SCOPE_GLOBAL) >= 0;
  const std::string reason = flushed ? std::string() : hdf5_reason();
  // Given up before the call: whatever H5Fclose answers, the identifier is not used again.
  const bool closed = H5Fclose(std::exchange(file_, -1)) >= 0;
  if (!flushed) throw Error(final_.string() + ": cannot write: " + reason);
  if (!closed) fail("", "cannot write");
}

}  // namespace attnscope::app
