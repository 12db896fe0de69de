// Root attributes of a v1 dump: read (either string layout h5py may produce), write, validate.
#include "dump_internal.hpp"
#include "hdf5_util.hpp"

#include "attnscope/error.hpp"
#include "attnscope/family.hpp"
#include "attnscope/variant.hpp"

#include <array>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace attnscope::dump_detail {

std::string layer_path(int layer, const char* name) {
  return "/layers/" + std::to_string(layer) + "/" + name;
}

namespace {

std::string attr_name(const char* name) { return std::string("attribute '") + name + "'"; }

h5::Handle open_attr(hid_t root, const char* name, const std::string& file) {
  if (H5Aexists(root, name) <= 0) {
    throw InputError(file, attr_name(name), "a root attribute (required by format v1)", "none");
  }
  h5::Handle a = h5::attr(H5Aopen(root, name, H5P_DEFAULT));
  h5::Handle s = h5::space(H5Aget_space(a.get()));
  const hssize_t n = H5Sget_simple_extent_npoints(s.get());
  if (n != 1) {
    throw InputError(file, attr_name(name), "a single value", std::to_string(n) + " values");
  }
  return a;
}

constexpr std::int64_t kMaxInt = std::int64_t{1} << 30;  // every integer attribute is below

/// The values of an integer attribute, each checked to lie in [lo, kMaxInt). Unsigned values are
/// read as such, so a uint64 beyond int64's range is reported with its true value.
std::vector<int> read_ints(hid_t attr, const char* name, const std::string& file, std::size_t n,
                           std::int64_t lo, const std::string& expected) {
  h5::Handle ft = h5::type(H5Aget_type(attr));
  if (H5Tget_class(ft.get()) != H5T_INTEGER) {
    throw InputError(file, attr_name(name), "an integer", h5::describe_type(ft.get()));
  }
  std::vector<int> out(n);
  if (H5Tget_sign(ft.get()) == H5T_SGN_NONE) {
    std::vector<std::uint64_t> v(n);
    if (n > 0 && H5Aread(attr, H5T_NATIVE_UINT64, v.data()) < 0) {
      throw InputError(file, attr_name(name), "a readable integer", h5::last_error());
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (v[i] >= static_cast<std::uint64_t>(kMaxInt) || static_cast<std::int64_t>(v[i]) < lo) {
        throw InputError(file, attr_name(name), expected, std::to_string(v[i]));
      }
      out[i] = static_cast<int>(v[i]);
    }
  } else {
    std::vector<std::int64_t> v(n);
    if (n > 0 && H5Aread(attr, H5T_NATIVE_INT64, v.data()) < 0) {
      throw InputError(file, attr_name(name), "a readable integer", h5::last_error());
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (v[i] >= kMaxInt || v[i] < lo) {
        throw InputError(file, attr_name(name), expected, std::to_string(v[i]));
      }
      out[i] = static_cast<int>(v[i]);
    }
  }
  return out;
}

}  // namespace

std::string root_string(hid_t root, const char* name, const std::string& file) {
  h5::Handle a = open_attr(root, name, file);
  h5::Handle ft = h5::type(H5Aget_type(a.get()));
  if (H5Tget_class(ft.get()) != H5T_STRING) {
    throw InputError(file, attr_name(name), "a string", h5::describe_type(ft.get()));
  }
  h5::Handle mt = h5::type(H5Tcopy(ft.get()));
  std::string value;
  if (H5Tis_variable_str(ft.get()) > 0) {
    // HDF5 1.10 follows the stored heap reference without checking it: check it first.
    const std::string fault = h5::vlen_string_attribute_fault(file, name);
    if (!fault.empty()) throw InputError(file, attr_name(name), "a readable string", "a damaged attribute: " + fault);
    char* p = nullptr;
    if (H5Aread(a.get(), mt.get(), &p) < 0) {
      throw InputError(file, attr_name(name), "a readable string", h5::last_error());
    }
    value = p != nullptr ? p : "";
    H5free_memory(p);
  } else {
    std::string buf(H5Tget_size(ft.get()), '\0');
    if (H5Aread(a.get(), mt.get(), buf.data()) < 0) {
      throw InputError(file, attr_name(name), "a readable string", h5::last_error());
    }
    value = buf.substr(0, buf.find('\0'));
    while (!value.empty() && value.back() == ' ') value.pop_back();  // space-padded strings
  }
  return value;
}

int root_int(hid_t root, const char* name, const std::string& file) {
  h5::Handle a = open_attr(root, name, file);
  return read_ints(a.get(), name, file, 1, -kMaxInt + 1, "an integer below 2^30").front();
}

double root_double(hid_t root, const char* name, const std::string& file) {
  h5::Handle a = open_attr(root, name, file);
  h5::Handle ft = h5::type(H5Aget_type(a.get()));
  if (H5Tget_class(ft.get()) != H5T_FLOAT) {
    throw InputError(file, attr_name(name), "a float", h5::describe_type(ft.get()));
  }
  double v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_DOUBLE, &v) < 0) {
    throw InputError(file, attr_name(name), "a readable float", h5::last_error());
  }
  return v;
}

namespace {

void write_string(hid_t root, const char* name, const std::string& value) {
  h5::Handle t = h5::type(H5Tcopy(H5T_C_S1));
  H5Tset_size(t.get(), H5T_VARIABLE);
  H5Tset_cset(t.get(), H5T_CSET_UTF8);
  h5::Handle s = h5::space(H5Screate(H5S_SCALAR));
  h5::Handle a = h5::attr(H5Acreate2(root, name, t.get(), s.get(), H5P_DEFAULT, H5P_DEFAULT));
  const char* p = value.c_str();
  if (!a.valid() || H5Awrite(a.get(), t.get(), &p) < 0) {
    throw Error(std::string("cannot write attribute ") + name + ": " + h5::last_error());
  }
}

void write_scalar(hid_t root, const char* name, hid_t file_type, hid_t mem_type, const void* v) {
  h5::Handle s = h5::space(H5Screate(H5S_SCALAR));
  h5::Handle a = h5::attr(H5Acreate2(root, name, file_type, s.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!a.valid() || H5Awrite(a.get(), mem_type, v) < 0) {
    throw Error(std::string("cannot write attribute ") + name + ": " + h5::last_error());
  }
}

void write_int(hid_t root, const char* name, std::int64_t v) {
  write_scalar(root, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v);
}

void require_positive(const std::string& file, const char* name, int v) {
  if (v <= 0) throw InputError(file, attr_name(name), "a positive integer", std::to_string(v));
}

void require_below_limit(const std::string& file, const char* name, int v) {
  if (v >= kMaxInt) throw InputError(file, attr_name(name), "an integer below 2^30", std::to_string(v));
}

}  // namespace

DumpAttributes read_attributes(hid_t root, const std::string& file) {
  const std::string format = root_string(root, "format", file);
  if (format != kFormatName) {
    throw InputError(file, attr_name("format"), std::string("'") + kFormatName + "'",
                     "'" + format + "'");
  }
  DumpAttributes a;
  a.format_version = root_int(root, "format_version", file);
  if (a.format_version != kFormatVersion) {
    throw InputError(file, attr_name("format_version"), std::to_string(kFormatVersion),
                     std::to_string(a.format_version));
  }
  a.model_name = root_string(root, "model_name", file);
  a.attention_family = root_string(root, "attention_family", file);
  a.convention = root_string(root, "convention", file);
  a.feature_map = root_string(root, "feature_map", file);
  a.scale = root_double(root, "scale", file);
  a.num_layers = root_int(root, "num_layers", file);
  a.num_heads = root_int(root, "num_heads", file);
  a.head_dim = root_int(root, "head_dim", file);
  a.num_tokens = root_int(root, "num_tokens", file);
  a.grid.height = root_int(root, "grid_height", file);
  a.grid.width = root_int(root, "grid_width", file);
  a.grid.prefix = root_int(root, "prefix_tokens", file);
  validate_attributes(a, file);
  return a;
}

DumpAttributes read_layer_attributes(hid_t file_id, const std::string& group,
                                     const DumpAttributes& root, const std::string& file) {
  DumpAttributes a = root;
  h5::Handle g = h5::group(H5Gopen2(file_id, group.c_str(), H5P_DEFAULT));
  if (!g.valid()) throw InputError(file, group, "a readable group", h5::last_error());
  const std::pair<const char*, std::string*> own[] = {{"attention_family", &a.attention_family},
                                                      {"feature_map", &a.feature_map},
                                                      {"convention", &a.convention}};
  bool any = false;
  for (const auto& [name, value] : own) {
    if (H5Aexists(g.get(), name) <= 0) continue;
    try {
      *value = root_string(g.get(), name, file);
    } catch (const InputError& e) {
      throw InputError(file, group + " " + e.object(), "a string", e.what());
    }
    any = true;
  }
  if (!any) return a;
  try {
    validate_attributes(a, file);
  } catch (const InputError& e) {
    throw InputError(file, group + " " + e.object(),
                     "a variant of the registry (attnscope info --families) for this layer",
                     "'" + a.attention_family + ":" + a.feature_map + "@" + a.convention + "'");
  }
  return a;
}

std::vector<int> read_source_layers(hid_t root, const std::string& file, int num_layers) {
  const char* name = "source_layers";
  if (H5Aexists(root, name) <= 0) return {};
  h5::Handle a = h5::attr(H5Aopen(root, name, H5P_DEFAULT));
  h5::Handle s = h5::space(H5Aget_space(a.get()));
  const int rank = H5Sget_simple_extent_ndims(s.get());
  const hssize_t n = H5Sget_simple_extent_npoints(s.get());
  if (rank > 1 || n != num_layers) {
    throw InputError(file, attr_name(name),
                     "one model layer index per dump layer (num_layers = " +
                         std::to_string(num_layers) + ")",
                     std::to_string(n) + " values" + (rank > 1 ? " in " + std::to_string(rank) + "-D" : ""));
  }
  std::vector<int> layers = read_ints(a.get(), name, file, static_cast<std::size_t>(n), 0,
                                      "layer indices >= 0 and below 2^30");
  for (std::size_t i = 0; i < layers.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (layers[i] == layers[j]) {
        throw InputError(file, attr_name(name), "distinct layer indices",
                         "layer " + std::to_string(layers[i]) + " at positions " +
                             std::to_string(j) + " and " + std::to_string(i));
      }
    }
  }
  return layers;
}

void validate_attributes(const DumpAttributes& a, const std::string& file) {
  if (!family_named(a.attention_family)) {
    throw InputError(file, attr_name("attention_family"), "one of " + known_families(),
                     "'" + a.attention_family + "'");
  }
  if (!find_convention(a.convention)) {
    throw InputError(file, attr_name("convention"), convention_names(), "'" + a.convention + "'");
  }
  if (a.feature_map.empty()) {
    throw InputError(file, attr_name("feature_map"), "a feature-map spec or 'none'", "''");
  }
  if (!(std::isfinite(a.scale) && a.scale > 0)) {
    throw InputError(file, attr_name("scale"), "a positive finite float", std::to_string(a.scale));
  }
  const std::pair<const char*, int> sizes[] = {
      {"num_layers", a.num_layers}, {"num_heads", a.num_heads},    {"head_dim", a.head_dim},
      {"num_tokens", a.num_tokens}, {"grid_height", a.grid.height}, {"grid_width", a.grid.width}};
  for (const auto& [name, v] : sizes) {
    require_positive(file, name, v);
    require_below_limit(file, name, v);
  }
  if (a.grid.prefix < 0) {
    throw InputError(file, attr_name("prefix_tokens"), "an integer >= 0",
                     std::to_string(a.grid.prefix));
  }
  require_below_limit(file, "prefix_tokens", a.grid.prefix);
  // In 64 bits: each attribute is below 2^30, their product need not fit an int.
  const long long grid_tokens =
      a.grid.prefix + static_cast<long long>(a.grid.height) * a.grid.width;
  if (a.num_tokens != grid_tokens) {
    throw InputError(file, attr_name("num_tokens"),
                     "prefix_tokens + grid_height * grid_width = " + std::to_string(grid_tokens),
                     std::to_string(a.num_tokens));
  }
  try {
    (void)a.variant();  // attention_family, feature_map and convention must name a variant
  } catch (const UsageError& e) {
    throw InputError(file, attr_name("feature_map"),
                     "a feature map that fits attention_family '" + a.attention_family + "'",
                     "'" + a.feature_map + "' (" + e.what() + ")");
  }
}

void write_attributes(hid_t root, const DumpAttributes& a) {
  write_string(root, "format", kFormatName);
  write_int(root, "format_version", kFormatVersion);
  write_string(root, "model_name", a.model_name);
  write_string(root, "attention_family", a.attention_family);
  write_string(root, "convention", a.convention);
  write_string(root, "feature_map", a.feature_map);
  write_scalar(root, "scale", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &a.scale);
  write_int(root, "num_layers", a.num_layers);
  write_int(root, "num_heads", a.num_heads);
  write_int(root, "head_dim", a.head_dim);
  write_int(root, "num_tokens", a.num_tokens);
  write_int(root, "grid_height", a.grid.height);
  write_int(root, "grid_width", a.grid.width);
  write_int(root, "prefix_tokens", a.grid.prefix);
}

namespace {

// A branch-free pass the compiler vectorises: a float is NaN or Inf exactly when its exponent
// bits are all ones. Only a block that fails is scanned again to name the first bad value.
bool all_finite(const float* data, std::size_t n) {
  std::uint32_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, data + i, sizeof bits);
    bad |= static_cast<std::uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

}  // namespace

void check_finite(const float* data, const std::vector<hsize_t>& start,
                  const std::vector<hsize_t>& dims, const std::vector<const char*>& labels,
                  const std::string& file, const std::string& dataset, int image) {
  std::size_t n = 1;
  for (hsize_t d : dims) n *= d;
  if (all_finite(data, n)) return;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isfinite(data[i])) continue;
    std::vector<hsize_t> coord(dims.size());
    std::size_t rest = i;
    for (std::size_t k = dims.size(); k-- > 0;) {
      coord[k] = rest % dims[k];
      rest /= dims[k];
    }
    std::string where = "image " + std::to_string(image);
    for (std::size_t k = 0; k < dims.size(); ++k) {
      where += std::string(", ") + labels[k] + " " + std::to_string(start[k] + coord[k]);
    }
    throw InputError(file, dataset, "finite values",
                     std::string(std::isnan(data[i]) ? "NaN" : "Inf") + " at " + where);
  }
}

std::uint16_t float_to_half(float f) {
  std::uint32_t x = 0;
  static_assert(sizeof x == sizeof f);
  std::memcpy(&x, &f, sizeof x);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000U);
  const std::uint32_t ax = x & 0x7fffffffU;
  if (ax >= 0x7f800000U) {  // Inf stays Inf; NaN stays a (quiet) NaN
    return static_cast<std::uint16_t>(sign | 0x7c00U | (ax > 0x7f800000U ? 0x200U : 0U));
  }
  if (ax >= 0x477ff000U) return static_cast<std::uint16_t>(sign | 0x7c00U);  // rounds past 65504
  if (ax < 0x33000000U) return sign;  // below half the smallest subnormal: rounds to zero
  // Round the kept bits to nearest, ties to even, given `drop` low bits to discard.
  auto round_shift = [](std::uint32_t v, unsigned drop) {
    const std::uint32_t kept = v >> drop;
    const std::uint32_t rem = v & ((1U << drop) - 1U);
    const std::uint32_t halfway = 1U << (drop - 1U);
    return kept + ((rem > halfway || (rem == halfway && (kept & 1U) != 0U)) ? 1U : 0U);
  };
  if (ax < 0x38800000U) {  // a half subnormal: units of 2^-24
    const std::uint32_t mant = (ax & 0x7fffffU) | 0x800000U;
    const unsigned exp = ax >> 23;  // value = mant * 2^(exp - 150)
    return static_cast<std::uint16_t>(sign | round_shift(mant, 126U - exp));
  }
  // Normal: rebias the exponent (127 -> 15) and drop 13 mantissa bits; a carry moves into the
  // exponent, which is the right answer.
  return static_cast<std::uint16_t>(sign | round_shift(ax - (112U << 23), 13U));
}

}  // namespace attnscope::dump_detail
