// Per-layer family parameters of a dump (dump_family_params.hpp): read apart from the dump reader.
#include "attnscope/dump_family_params.hpp"

#include "attnscope/error.hpp"
#include "dump_internal.hpp"
#include "hdf5_util.hpp"

#include <algorithm>
#include <cmath>

namespace attnscope {
namespace {

std::string group_path(int layer) { return "/layers/" + std::to_string(layer) + "/family_params"; }

/// The dataset at `object`, or an InputError saying it is missing.
h5::Handle open_dataset(hid_t file, const std::string& path, const std::string& object,
                        const std::string& expected) {
  if (!h5::exists(file, object.substr(1))) throw InputError(path, object, expected, "none");
  h5::Handle d = h5::dataset(H5Dopen2(file, object.c_str(), H5P_DEFAULT));
  if (!d.valid())
    throw InputError(path, object, expected, "an unreadable dataset (" + h5::last_error() + ")");
  const std::vector<std::string> missing = h5::unavailable_filters(d.get());
  if (!missing.empty())
    throw InputError(path, object, expected, "a dataset compressed with " + missing[0]);
  return d;
}

/// Every value read as float; throws naming the object on a read failure or a non-finite value.
std::vector<float> read_floats(hid_t d, hid_t space, hid_t memspace, std::size_t count,
                               const std::string& path, const std::string& object) {
  std::vector<float> out(count);
  if (count > 0 && H5Dread(d, H5T_NATIVE_FLOAT, memspace, space, H5P_DEFAULT, out.data()) < 0) {
    throw InputError(path, object, "readable values", "a read error (" + h5::last_error() + ")");
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) {
      throw InputError(path, object, "finite values",
                       "a non-finite value at flat index " + std::to_string(i));
    }
  }
  return out;
}

}  // namespace

std::vector<std::string> family_param_names(const std::string& path, int layer) {
  const h5::Handle f = dump_detail::open_read_only(path);
  const std::string g = group_path(layer);
  std::vector<std::string> names;
  if (!h5::exists(f.get(), g.substr(1))) return names;
  const h5::Handle group = h5::group(H5Gopen2(f.get(), g.c_str(), H5P_DEFAULT));
  if (!group.valid())
    throw InputError(path, g, "a group", "an unreadable object (" + h5::last_error() + ")");
  hsize_t count = 0;
  H5G_info_t info;
  if (H5Gget_info(group.get(), &info) >= 0) count = info.nlinks;
  for (hsize_t i = 0; i < count; ++i) {
    const ssize_t len = H5Lget_name_by_idx(group.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr,
                                           0, H5P_DEFAULT);
    if (len < 0) continue;
    std::string name(static_cast<std::size_t>(len) + 1, '\0');
    H5Lget_name_by_idx(group.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(),
                       H5P_DEFAULT);
    name.resize(static_cast<std::size_t>(len));
    names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

FamilyParam read_family_param(const std::string& path, int layer, const std::string& name,
                              int heads, long rows, long cols) {
  const h5::Handle f = dump_detail::open_read_only(path);
  const std::string object = group_path(layer) + "/" + name;
  std::string expected = "float32 [" + std::to_string(heads) +
                         (rows >= 0 ? ", " + std::to_string(rows) : std::string(", rows")) +
                         (cols >= 0 ? ", " + std::to_string(cols) : std::string(", cols")) + "]";
  const h5::Handle d = open_dataset(f.get(), path, object, expected);
  const h5::Handle type = h5::type(H5Dget_type(d.get()));
  const std::vector<hsize_t> dims = h5::dims(d.get());
  const bool is_f32 = H5Tget_class(type.get()) == H5T_FLOAT && H5Tget_size(type.get()) == 4;
  const bool rank_ok = dims.size() == 2 || dims.size() == 3;
  if (!is_f32 || !rank_ok) {
    throw InputError(path, object, expected,
                     h5::describe_type(type.get()) + " " + h5::shape_string(dims));
  }
  const hsize_t got_rows = dims.size() == 3 ? dims[1] : 1, got_cols = dims.back();
  if (dims[0] != static_cast<hsize_t>(heads) ||
      (rows >= 0 && got_rows != static_cast<hsize_t>(rows)) ||
      (cols >= 0 && got_cols != static_cast<hsize_t>(cols))) {
    throw InputError(path, object, expected, "float32 " + h5::shape_string(dims));
  }
  const h5::Handle space = h5::space(H5Dget_space(d.get()));
  const std::vector<float> v =
      read_floats(d.get(), space.get(), H5S_ALL,
                  static_cast<std::size_t>(heads * got_rows * got_cols), path, object);
  FamilyParam out{name, {}};
  for (int h = 0; h < heads; ++h) {
    MatD m(static_cast<Eigen::Index>(got_rows), static_cast<Eigen::Index>(got_cols));
    for (hsize_t r = 0; r < got_rows; ++r) {
      for (hsize_t c = 0; c < got_cols; ++c)
        m(static_cast<Eigen::Index>(r), static_cast<Eigen::Index>(c)) =
            v[(h * got_rows + r) * got_cols + c];
    }
    out.per_head.push_back(std::move(m));
  }
  return out;
}

std::string family_param_attribute(const std::string& path, int layer, const std::string& name,
                                   const std::string& fallback) {
  const h5::Handle f = dump_detail::open_read_only(path);
  const std::string g = group_path(layer);
  if (!h5::exists(f.get(), g.substr(1)) ||
      H5Aexists_by_name(f.get(), g.c_str(), name.c_str(), H5P_DEFAULT) <= 0) {
    return fallback;
  }
  const std::string object = g + " attribute " + name;
  const h5::Handle a =
      h5::attr(H5Aopen_by_name(f.get(), g.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT));
  const h5::Handle type = h5::type(H5Aget_type(a.get()));
  if (!a.valid() || H5Tget_class(type.get()) != H5T_STRING) {
    throw InputError(path, object, "a string",
                     a.valid() ? h5::describe_type(type.get()) : "an unreadable attribute");
  }
  if (H5Tis_variable_str(type.get()) > 0) {
    char* s = nullptr;
    const h5::Handle mem = h5::type(H5Tcopy(H5T_C_S1));
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    if (H5Aread(a.get(), mem.get(), &s) < 0 || s == nullptr)
      throw InputError(path, object, "a string", "an unreadable string");
    std::string out(s);
    H5free_memory(s);
    return out;
  }
  const std::size_t size = H5Tget_size(type.get());
  std::string out(size, '\0');
  if (H5Aread(a.get(), type.get(), out.data()) < 0)
    throw InputError(path, object, "a string", "an unreadable string");
  out.erase(std::find(out.begin(), out.end(), '\0'), out.end());
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

bool has_layer_agents(const std::string& path, int layer) {
  const h5::Handle f = dump_detail::open_read_only(path);
  return h5::exists(f.get(), "layers/" + std::to_string(layer) + "/agents");
}

std::vector<MatD> read_layer_agents(const std::string& path, int layer, long image, int heads,
                                    int head_dim) {
  const h5::Handle f = dump_detail::open_read_only(path);
  const std::string object = "/layers/" + std::to_string(layer) + "/agents";
  const std::string expected = "float16 or float32 [images, " + std::to_string(heads) +
                               ", agents, " + std::to_string(head_dim) + "]";
  const h5::Handle d = open_dataset(f.get(), path, object, expected);
  const h5::Handle type = h5::type(H5Dget_type(d.get()));
  const std::vector<hsize_t> dims = h5::dims(d.get());
  if (H5Tget_class(type.get()) != H5T_FLOAT || H5Tget_size(type.get()) > 4 || dims.size() != 4 ||
      dims[1] != static_cast<hsize_t>(heads) || dims[3] != static_cast<hsize_t>(head_dim) ||
      dims[2] < 1) {
    throw InputError(path, object, expected,
                     h5::describe_type(type.get()) + " " + h5::shape_string(dims));
  }
  if (image < 0 || static_cast<hsize_t>(image) >= dims[0]) {
    throw InputError(path, object, "image " + std::to_string(image) + " among its images",
                     std::to_string(dims[0]) + " images");
  }
  const h5::Handle space = h5::space(H5Dget_space(d.get()));
  const hsize_t start[4] = {static_cast<hsize_t>(image), 0, 0, 0};
  const hsize_t count[4] = {1, dims[1], dims[2], dims[3]};
  H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
  const h5::Handle memspace = h5::space(H5Screate_simple(4, count, nullptr));
  const std::vector<float> v =
      read_floats(d.get(), space.get(), memspace.get(),
                  static_cast<std::size_t>(dims[1] * dims[2] * dims[3]), path, object);
  std::vector<MatD> out;
  for (hsize_t h = 0; h < dims[1]; ++h) {
    MatD m(static_cast<Eigen::Index>(dims[2]), static_cast<Eigen::Index>(dims[3]));
    for (hsize_t a = 0; a < dims[2]; ++a) {
      for (hsize_t t = 0; t < dims[3]; ++t)
        m(static_cast<Eigen::Index>(a), static_cast<Eigen::Index>(t)) =
            v[(h * dims[2] + a) * dims[3] + t];
    }
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace attnscope
