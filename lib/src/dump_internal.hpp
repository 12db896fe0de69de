// Pieces shared by the dump reader and writer (private to the library).
#pragma once

#include "attnscope/dump.hpp"
#include "hdf5_util.hpp"

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

namespace attnscope::dump_detail {

inline constexpr const char* kFormatName = "attnscope-dump";
inline constexpr int kFormatVersion = 1;

/// "/layers/L/name".
std::string layer_path(int layer, const char* name);

/// Opens an HDF5 file read-only with the dump reader's checks and one-line errors (missing, not a
/// regular file, not HDF5, locked, marked open for writing).
h5::Handle open_read_only(const std::string& path);
/// Opens the dataset `name` ("/a/b") of `file`: InputError when it is missing, another kind of
/// object, or written with a filter this HDF5 cannot apply.
h5::Handle open_dataset(hid_t file, const std::string& name, const std::string& path);
/// Reads the selection `fs` of `ds` as `n` floats laid out as `ms` (IEEE half widened on the fast
/// path, through `scratch`; `half` is h5::half_type()). Empty, or HDF5's diagnosis of a failure.
std::string read_floats(hid_t ds, hid_t ms, hid_t fs, float* out, std::size_t n, hid_t half,
                        std::vector<std::uint16_t>& scratch);

/// One scalar root attribute (string, integer below 2^30, float); InputError naming the attribute
/// when it is missing, not a single value or of another type. Shared with the model reader.
std::string root_string(hid_t root, const char* name, const std::string& file);
int root_int(hid_t root, const char* name, const std::string& file);
double root_double(hid_t root, const char* name, const std::string& file);

/// Reads and validates the root attributes. Throws InputError naming the attribute.
DumpAttributes read_attributes(hid_t root, const std::string& file);
/// A layer's attributes: the root's, with attention_family, feature_map and convention replaced
/// by the group's own (`group` is "/layers/L") where it has them; InputError naming the group and
/// attribute when one is not a string or the three do not name a variant of the registry.
DumpAttributes read_layer_attributes(hid_t file_id, const std::string& group,
                                     const DumpAttributes& root, const std::string& file);
/// A layer's geometry as the root attributes state it (no windows, keys = queries).
LayerGeometry root_geometry(const DumpAttributes& a);
/// A layer's geometry (geometry.hpp): the root's, with the group's own num_heads, head_dim, scale,
/// grid_height, grid_width, prefix_tokens, key_grid_height/width, and windows (windows,
/// window_height, window_width, shift, token_positions, window_mask) where it has them.
/// InputError naming the group and attribute or dataset when one is out of range.
LayerGeometry read_layer_geometry(hid_t file_id, const std::string& group, const DumpAttributes& root,
                                  const std::string& file);
/// The optional `source_layers` attribute: num_layers distinct model layer indices, each >= 0 and
/// below 2^30 (empty when absent). Throws InputError naming the attribute.
std::vector<int> read_source_layers(hid_t root, const std::string& file, int num_layers);
/// Writes the root attributes as h5py would (variable-length UTF-8 strings, int64, float64).
void write_attributes(hid_t root, const DumpAttributes& a);
/// Every check the reader makes of the root attributes once read: known values, sizes positive
/// and below 2^30, num_tokens == prefix + height * width, and a family, feature map and
/// convention that name a variant of the registry. The writer (and synth) call it before writing.
void validate_attributes(const DumpAttributes& a, const std::string& file);

/// Throws InputError at the first NaN/Inf of a block read from `dataset` for `image`; the block's
/// flat index is unravelled over `dims` and offset by `start`, each coordinate named by `labels`.
void check_finite(const float* data, const std::vector<hsize_t>& start,
                  const std::vector<hsize_t>& dims, const std::vector<const char*>& labels,
                  const std::string& file, const std::string& dataset, int image);

/// Rounds a float to the nearest IEEE half (ties to even), as numpy's float16 does.
std::uint16_t float_to_half(float f);

}  // namespace attnscope::dump_detail
