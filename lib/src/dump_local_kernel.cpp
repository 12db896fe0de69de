// The local term's depthwise kernel of a dump (dump_local_kernel.hpp): read apart from the dump
// reader, like the family parameters.
#include "attnscope/dump_local_kernel.hpp"

#include "attnscope/error.hpp"
#include "dump_internal.hpp"
#include "hdf5_util.hpp"

#include <cmath>

namespace attnscope {
namespace {

/// An integer attribute of the dataset `d`, in [0, 2^30); InputError naming it otherwise.
int int_attribute(hid_t d, const char* name, const std::string& path, const std::string& object) {
  const std::string where = object + " attribute " + name;
  if (H5Aexists(d, name) <= 0) throw InputError(path, where, "an integer", "none");
  const h5::Handle a = h5::attr(H5Aopen(d, name, H5P_DEFAULT));
  const h5::Handle type = h5::type(H5Aget_type(a.get()));
  const h5::Handle space = h5::space(H5Aget_space(a.get()));
  if (!a.valid() || H5Tget_class(type.get()) != H5T_INTEGER ||
      H5Sget_simple_extent_npoints(space.get()) != 1) {
    throw InputError(path, where, "one integer",
                     a.valid() ? h5::describe_type(type.get()) : "an unreadable attribute");
  }
  long long v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_LLONG, &v) < 0 || v < 0 || v >= (1LL << 30)) {
    throw InputError(path, where, "an integer in [0, 2^30)", std::to_string(v));
  }
  return static_cast<int>(v);
}

/// Reads the hyperslab `start`/`count` of `d` as float, every value finite.
std::vector<float> read_block(hid_t d, const std::vector<hsize_t>& start,
                              const std::vector<hsize_t>& count, const std::string& path,
                              const std::string& object) {
  const h5::Handle space = h5::space(H5Dget_space(d));
  H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
  const h5::Handle mem =
      h5::space(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr));
  std::size_t n = 1;
  for (hsize_t c : count) n *= static_cast<std::size_t>(c);
  std::vector<float> out(n);
  if (n > 0 && H5Dread(d, H5T_NATIVE_FLOAT, mem.get(), space.get(), H5P_DEFAULT, out.data()) < 0) {
    throw InputError(path, object, "readable values", "a read error (" + h5::last_error() + ")");
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(out[i]))
      throw InputError(path, object, "finite values",
                       "a non-finite value at index " + std::to_string(i));
  }
  return out;
}

bool is_float32(hid_t d) {
  const h5::Handle type = h5::type(H5Dget_type(d));
  return H5Tget_class(type.get()) == H5T_FLOAT && H5Tget_size(type.get()) == 4;
}

std::string type_and_shape(hid_t d) {
  const h5::Handle type = h5::type(H5Dget_type(d));
  return h5::describe_type(type.get()) + " " + h5::shape_string(h5::dims(d));
}

}  // namespace

MatD LocalKernel::head_mean(int head, int unit) const {
  const MatD& t = taps.at(static_cast<std::size_t>(head)).at(static_cast<std::size_t>(unit));
  const VecD mean = t.colwise().mean().transpose();
  MatD k(height, width);
  for (int a = 0; a < height; ++a) {
    for (int b = 0; b < width; ++b) k(a, b) = mean(a * width + b);
  }
  return k;
}

bool has_local_kernel(const std::string& path, int layer) {
  const h5::Handle f = dump_detail::open_read_only(path);
  return h5::exists(f.get(), "layers/" + std::to_string(layer) + "/local_kernel");
}

LocalKernel read_local_kernel(const std::string& path, int layer, long image,
                              const LayerGeometry& geo) {
  const h5::Handle f = dump_detail::open_read_only(path);
  const std::string object = dump_detail::layer_path(layer, "local_kernel");
  const h5::Handle d = dump_detail::open_dataset(f.get(), object, path);
  const std::vector<hsize_t> dims = h5::dims(d.get());
  const hsize_t heads = static_cast<hsize_t>(geo.num_heads),
                hd = static_cast<hsize_t>(geo.head_dim);
  const hsize_t units = static_cast<hsize_t>(geo.units());
  const std::string hw = std::to_string(heads) + ", " + std::to_string(hd) + ", kh, kw]";
  const std::string expected =
      "float32 [" + hw + " or [images, " +
      (geo.windows > 0 ? std::to_string(heads) + ", " + std::to_string(units) + ", " +
                             std::to_string(hd) + ", kh, kw]"
                       : hw) +
      " (odd kh, kw)";
  const std::size_t r = dims.size();
  const bool per_image = r == (geo.windows > 0 ? 6u : 5u);
  const std::size_t h_axis = per_image ? 1 : 0;  // [images,] heads, [windows,] head_dim, kh, kw
  const bool shape_ok = is_float32(d.get()) && (r == 4 || per_image) && dims[h_axis] == heads &&
                        dims[r - 3] == hd && (r != 6 || dims[2] == units) && dims[r - 2] % 2 == 1 &&
                        dims[r - 1] % 2 == 1;
  if (!shape_ok) throw InputError(path, object, expected, type_and_shape(d.get()));
  LocalKernel k;
  k.height = static_cast<int>(dims[r - 2]);
  k.width = static_cast<int>(dims[r - 1]);
  k.pad_height = int_attribute(d.get(), "padding_height", path, object);
  k.pad_width = int_attribute(d.get(), "padding_width", path, object);
  if (2 * k.pad_height + 1 != k.height || 2 * k.pad_width + 1 != k.width) {
    throw InputError(path, object,
                     "padding that keeps the grid: padding_height, padding_width = " +
                         std::to_string((k.height - 1) / 2) + ", " +
                         std::to_string((k.width - 1) / 2),
                     std::to_string(k.pad_height) + ", " + std::to_string(k.pad_width));
  }
  if (per_image && (image < 0 || static_cast<hsize_t>(image) >= dims[0])) {
    throw InputError(path, object, "image " + std::to_string(image) + " among its images",
                     std::to_string(dims[0]) + " images");
  }
  std::vector<hsize_t> start(r, 0), count(dims);
  if (per_image) {
    start[0] = static_cast<hsize_t>(image);
    count[0] = 1;
  }
  const std::vector<float> v = read_block(d.get(), start, count, path, object);
  const hsize_t taps = dims[r - 2] * dims[r - 1];
  const hsize_t stored_units = per_image && geo.windows > 0 ? units : 1;
  k.taps.assign(heads, std::vector<MatD>(units));
  for (hsize_t h = 0; h < heads; ++h) {
    for (hsize_t u = 0; u < units; ++u) {
      const hsize_t su = stored_units == 1 ? 0 : u;
      MatD m(static_cast<Eigen::Index>(hd), static_cast<Eigen::Index>(taps));
      for (hsize_t c = 0; c < hd; ++c) {
        for (hsize_t t = 0; t < taps; ++t)
          m(static_cast<Eigen::Index>(c), static_cast<Eigen::Index>(t)) =
              v[((h * stored_units + su) * hd + c) * taps + t];
      }
      k.taps[h][u] = std::move(m);
    }
  }
  const std::string bias_object = dump_detail::layer_path(layer, "local_bias");
  if (h5::exists(f.get(), bias_object.substr(1))) {
    const h5::Handle b = dump_detail::open_dataset(f.get(), bias_object, path);
    const std::vector<hsize_t> bd = h5::dims(b.get());
    if (!is_float32(b.get()) || bd.size() != 2 || bd[0] != heads || bd[1] != hd) {
      throw InputError(path, bias_object,
                       "float32 [" + std::to_string(heads) + ", " + std::to_string(hd) + "]",
                       type_and_shape(b.get()));
    }
    const std::vector<float> bv = read_block(b.get(), {0, 0}, bd, path, bias_object);
    for (hsize_t h = 0; h < heads; ++h) {
      VecD row(static_cast<Eigen::Index>(hd));
      for (hsize_t c = 0; c < hd; ++c) row(static_cast<Eigen::Index>(c)) = bv[h * hd + c];
      k.bias.push_back(std::move(row));
    }
  }
  return k;
}

}  // namespace attnscope
