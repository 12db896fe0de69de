#include "hdf5_util.hpp"

#include <sstream>

namespace attnscope::h5 {

void quiet_hdf5() {
  // In a thread-safe HDF5 each thread has its own error-reporting settings: a reader used on a
  // prefetch thread must be silenced there too.
  thread_local bool quiet = false;
  if (quiet) return;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  quiet = true;
}

namespace {

herr_t collect(unsigned /*n*/, const H5E_error2_t* err, void* data) {
  if (err->desc != nullptr && err->desc[0] != '\0') {
    static_cast<std::vector<std::string>*>(data)->emplace_back(err->desc);
  }
  return 0;
}

}  // namespace

std::vector<std::string> error_stack() {
  std::vector<std::string> msgs;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect, &msgs);
  H5Eclear2(H5E_DEFAULT);
  return msgs;
}

std::string last_error() {
  // Walking downward goes from the API call to where the failure was detected; the last entry
  // is the most specific ("truncated file: eof = ...").
  const std::vector<std::string> msgs = error_stack();
  return msgs.empty() ? std::string() : msgs.back();
}

std::string system_reason() {
  const std::string msg = last_error();
  const std::string key = "error message = '";
  const std::size_t at = msg.find(key);
  if (at != std::string::npos) {
    const std::size_t end = msg.find('\'', at + key.size());
    if (end != std::string::npos) return msg.substr(at + key.size(), end - at - key.size());
  }
  return msg.empty() ? std::string("HDF5 error") : msg;
}

std::vector<std::string> unavailable_filters(hid_t ds) {
  std::vector<std::string> out;
  Handle dcpl = plist(H5Dget_create_plist(ds));
  if (!dcpl.valid()) return out;
  const int n = H5Pget_nfilters(dcpl.get());
  for (int i = 0; i < n; ++i) {
    unsigned flags = 0, cd[8] = {};
    std::size_t ncd = 8;
    char name[64] = {};
    const H5Z_filter_t id = H5Pget_filter2(dcpl.get(), static_cast<unsigned>(i), &flags, &ncd, cd,
                                           sizeof name, name, nullptr);
    if (id < 0 || H5Zfilter_avail(id) > 0) continue;
    out.push_back("filter " + std::to_string(id) + " (" + (name[0] ? name : "unnamed") + ")");
  }
  H5Eclear2(H5E_DEFAULT);  // a failed plugin search leaves messages behind
  return out;
}

bool exists(hid_t loc, const std::string& path) {
  std::size_t pos = 0;
  while (true) {
    const std::size_t next = path.find('/', pos);
    const std::string prefix = path.substr(0, next);
    if (H5Lexists(loc, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (next == std::string::npos) return true;
    pos = next + 1;
  }
}

Handle small_metadata_cache_fapl() {
  Handle fapl = plist(H5Pcreate(H5P_FILE_ACCESS));
  H5AC_cache_config_t c;
  c.version = H5AC__CURR_CACHE_CONFIG_VERSION;
  if (H5Pget_mdc_config(fapl.get(), &c) >= 0) {
    c.set_initial_size = true;
    c.initial_size = std::size_t{1} << 20;
    c.min_size = std::size_t{1} << 20;
    c.max_size = std::size_t{4} << 20;
    H5Pset_mdc_config(fapl.get(), &c);
  }
  H5Eclear2(H5E_DEFAULT);
  return fapl;
}

Handle half_type() {
  // h5py: IEEE_F32LE copied, fields (sign 15, exponent 10 x 5 bits, mantissa 0 x 10 bits),
  // size 2, exponent bias 15.
  Handle t = type(H5Tcopy(H5T_IEEE_F32LE));
  H5Tset_fields(t.get(), 15, 10, 5, 0, 10);
  H5Tset_size(t.get(), 2);
  H5Tset_ebias(t.get(), 15);
  return t;
}

std::string describe_type(hid_t t) {
  const std::size_t bytes = H5Tget_size(t);
  const std::string bits = std::to_string(bytes * 8);
  switch (H5Tget_class(t)) {
    case H5T_FLOAT:
      return "float" + bits;
    case H5T_INTEGER:
      return std::string(H5Tget_sign(t) == H5T_SGN_NONE ? "uint" : "int") + bits;
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ENUM:
      return "enum";
    case H5T_ARRAY:
      return "array";
    case H5T_VLEN:
      return "vlen";
    default:
      return "other type";
  }
}

std::vector<hsize_t> dims(hid_t ds) {
  Handle s = space(H5Dget_space(ds));
  const int rank = H5Sget_simple_extent_ndims(s.get());
  std::vector<hsize_t> d(rank > 0 ? static_cast<std::size_t>(rank) : 0);
  if (rank > 0) H5Sget_simple_extent_dims(s.get(), d.data(), nullptr);
  return d;
}

std::string shape_string(const std::vector<hsize_t>& d) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < d.size(); ++i) os << (i ? ", " : "") << d[i];
  os << "]";
  return os.str();
}

}  // namespace attnscope::h5
