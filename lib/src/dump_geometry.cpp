// Reading one layer's geometry (geometry.hpp, docs/dump-format.md "Per-layer geometry"): the
// /layers/L group's own shape attributes over the root's, and the windows' datasets.
#include "dump_internal.hpp"
#include "hdf5_util.hpp"

#include "attnscope/error.hpp"

#include <algorithm>
#include <memory>

namespace attnscope::dump_detail {
namespace {

struct GroupReader {
  hid_t g;
  const std::string& group;
  const std::string& file;

  bool has(const char* name) const { return H5Aexists(g, name) > 0; }

  int get_int(const char* name, int dflt) const {
    if (!has(name)) return dflt;
    try {
      return root_int(g, name, file);
    } catch (const InputError& e) {
      throw InputError(file, group + " " + e.object(), "an integer", e.what());
    }
  }

  double get_double(const char* name, double dflt) const {
    if (!has(name)) return dflt;
    try {
      return root_double(g, name, file);
    } catch (const InputError& e) {
      throw InputError(file, group + " " + e.object(), "a float", e.what());
    }
  }

  [[noreturn]] void bad(const std::string& what, const std::string& expected,
                        const std::string& found) const {
    throw InputError(file, group + " " + what, expected, found);
  }
};

/// An integer dataset read whole as int64, its shape checked against `want`.
std::vector<long long> read_int_dataset(hid_t file_id, const std::string& name,
                                        const std::string& path, const std::vector<hsize_t>& want,
                                        const char* layout) {
  const h5::Handle ds = open_dataset(file_id, name, path);
  const std::vector<hsize_t> got = h5::dims(ds.get());
  if (got != want) {
    throw InputError(path, name, "shape " + h5::shape_string(want) + " " + layout,
                     h5::shape_string(got));
  }
  const h5::Handle t = h5::type(H5Dget_type(ds.get()));
  const H5T_class_t cls = H5Tget_class(t.get());
  if (cls != H5T_INTEGER && cls != H5T_ENUM) {
    throw InputError(path, name, "an integer (or bool) dtype", h5::describe_type(t.get()));
  }
  hsize_t n = 1;
  for (hsize_t x : got) n *= x;
  std::vector<long long> out(static_cast<std::size_t>(n));
  if (n > 0 && H5Dread(ds.get(), H5T_NATIVE_LLONG, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0) {
    throw InputError(path, name, "readable data", h5::last_error());
  }
  return out;
}

void read_positions(hid_t file_id, const GroupReader& r, LayerGeometry& geo,
                    const std::string& pos_name) {
  const std::string& path = r.file;
  const auto W = static_cast<hsize_t>(geo.windows), T = static_cast<hsize_t>(geo.window_tokens());
  const std::vector<long long> pos =
      read_int_dataset(file_id, pos_name, path, {W, T, 2}, "[windows, window_tokens, 2]");
  geo.positions.resize(pos.size());
  for (std::size_t i = 0; i < pos.size(); i += 2) {
    const long long row = pos[i], col = pos[i + 1];
    if (row < 0 || row >= geo.grid.height || col < 0 || col >= geo.grid.width) {
      const std::size_t w = i / 2 / static_cast<std::size_t>(T), t = i / 2 % static_cast<std::size_t>(T);
      throw InputError(path, pos_name,
                       "cells of the " + std::to_string(geo.grid.height) + "x" +
                           std::to_string(geo.grid.width) + " grid",
                       "(" + std::to_string(row) + ", " + std::to_string(col) + ") at window " +
                           std::to_string(w) + ", token " + std::to_string(t));
    }
    geo.positions[i] = static_cast<int>(row);
    geo.positions[i + 1] = static_cast<int>(col);
  }
  // The windows cut the grid into pieces: every cell in exactly one window, once.
  const long long cells = static_cast<long long>(geo.grid.height) * geo.grid.width;
  if (static_cast<long long>(W * T) != cells) {
    throw InputError(path, pos_name,
                     "windows that cover the " + std::to_string(geo.grid.height) + "x" +
                         std::to_string(geo.grid.width) + " grid once (windows x window tokens = " +
                         std::to_string(cells) + ")",
                     std::to_string(W) + " windows of " + std::to_string(T) + " tokens");
  }
  std::vector<int> seen(static_cast<std::size_t>(cells), -1);
  for (std::size_t i = 0; i < pos.size(); i += 2) {
    const std::size_t cell = static_cast<std::size_t>(pos[i] * geo.grid.width + pos[i + 1]);
    const auto token = static_cast<int>(i / 2);
    if (seen[cell] >= 0) {
      const auto at = [T](int k) {
        return "window " + std::to_string(k / static_cast<int>(T)) + ", token " +
               std::to_string(k % static_cast<int>(T));
      };
      throw InputError(path, pos_name, "each cell of the grid once",
                       "cell (" + std::to_string(pos[i]) + ", " + std::to_string(pos[i + 1]) +
                           ") at " + at(seen[cell]) + " and at " + at(token));
    }
    seen[cell] = token;
  }
}

/// CSwin's second stripe shape: second_heads_from, second_window_height/width and
/// second_token_positions ("Per-layer geometry" of docs/dump-format.md).
void read_second_shape(hid_t file_id, const GroupReader& r, LayerGeometry& geo) {
  const bool any = r.has("second_heads_from") || r.has("second_window_height") ||
                   r.has("second_window_width");
  if (!any) return;
  const int from = r.get_int("second_heads_from", 0);
  auto second = std::make_shared<LayerGeometry>(geo);
  second->window_height = r.get_int("second_window_height", 0);
  second->window_width = r.get_int("second_window_width", 0);
  if (from <= 0 || from >= geo.num_heads) {
    r.bad("attribute 'second_heads_from'",
          "a head in 1.." + std::to_string(geo.num_heads - 1) + " (the second stripe shape's first)",
          std::to_string(from));
  }
  if (second->window_height <= 0 || second->window_width <= 0 ||
      second->window_tokens() != geo.window_tokens()) {
    r.bad("attribute 'second_window_height'",
          "second_window_height x second_window_width of " + std::to_string(geo.window_tokens()) +
              " tokens, as window_height x window_width",
          std::to_string(second->window_height) + "x" + std::to_string(second->window_width));
  }
  if (geo.shift > 0) {
    r.bad("attribute 'second_heads_from'", "no shift on a layer of two stripe shapes",
          "shift " + std::to_string(geo.shift));
  }
  read_positions(file_id, r, *second, r.group + "/second_token_positions");
  second->window_mask.clear();
  geo.second_heads_from = from;
  geo.second = std::move(second);
}

void read_windows(hid_t file_id, const GroupReader& r, LayerGeometry& geo) {
  const std::string& path = r.file;
  const auto W = static_cast<hsize_t>(geo.windows), T = static_cast<hsize_t>(geo.window_tokens());
  read_positions(file_id, r, geo, r.group + "/token_positions");
  const std::string mask_name = r.group + "/window_mask";
  if (!h5::exists(file_id, mask_name.substr(1))) {
    if (geo.shift > 0) {
      throw InputError(path, mask_name,
            "a dataset [windows, window_tokens, window_tokens] of the allowed pairs (the layer's "
            "windows are shifted by " + std::to_string(geo.shift) + ")",
            "none");
    }
    return;
  }
  const std::vector<long long> m =
      read_int_dataset(file_id, mask_name, path, {W, T, T}, "[windows, queries, keys]");
  geo.window_mask.resize(m.size());
  for (std::size_t i = 0; i < m.size(); ++i) {
    if (m[i] != 0 && m[i] != 1) {
      throw InputError(path, mask_name, "values 0 or 1 (1 = the pair is allowed)",
                       std::to_string(m[i]) + " at flat index " + std::to_string(i));
    }
    geo.window_mask[i] = static_cast<unsigned char>(m[i]);
  }
}

}  // namespace

LayerGeometry root_geometry(const DumpAttributes& a) {
  LayerGeometry geo;
  geo.num_heads = a.num_heads;
  geo.head_dim = a.head_dim;
  geo.scale = a.scale;
  geo.grid = a.grid;
  geo.key_grid = a.grid;
  return geo;
}

LayerGeometry read_layer_geometry(hid_t file_id, const std::string& group, const DumpAttributes& root,
                                  const std::string& file) {
  LayerGeometry geo = root_geometry(root);
  const h5::Handle g = h5::group(H5Gopen2(file_id, group.c_str(), H5P_DEFAULT));
  if (!g.valid()) throw InputError(file, group, "a readable group", h5::last_error());
  const GroupReader r{g.get(), group, file};
  const auto positive = [&r](const char* name, int v) {
    if (v <= 0) r.bad(std::string("attribute '") + name + "'", "a positive integer", std::to_string(v));
  };
  geo.num_heads = r.get_int("num_heads", geo.num_heads);
  geo.head_dim = r.get_int("head_dim", geo.head_dim);
  geo.scale = r.get_double("scale", geo.scale);
  geo.grid.height = r.get_int("grid_height", geo.grid.height);
  geo.grid.width = r.get_int("grid_width", geo.grid.width);
  geo.grid.prefix = r.get_int("prefix_tokens", geo.grid.prefix);
  positive("num_heads", geo.num_heads);
  positive("head_dim", geo.head_dim);
  positive("grid_height", geo.grid.height);
  positive("grid_width", geo.grid.width);
  if (geo.grid.prefix < 0) {
    r.bad("attribute 'prefix_tokens'", "an integer >= 0", std::to_string(geo.grid.prefix));
  }
  if (!(geo.scale > 0)) r.bad("attribute 'scale'", "a positive float", std::to_string(geo.scale));
  const int tokens = r.get_int("num_tokens", geo.grid.tokens());
  if (tokens != geo.grid.tokens()) {
    r.bad("attribute 'num_tokens'",
          "prefix_tokens + grid_height * grid_width = " + std::to_string(geo.grid.tokens()),
          std::to_string(tokens));
  }
  geo.key_grid = geo.grid;
  const bool has_kh = r.has("key_grid_height"), has_kw = r.has("key_grid_width");
  if (has_kh != has_kw) {
    r.bad(has_kh ? "attribute 'key_grid_width'" : "attribute 'key_grid_height'",
          "key_grid_height and key_grid_width together", "one of them");
  }
  if (has_kh) {
    geo.key_grid.height = r.get_int("key_grid_height", 0);
    geo.key_grid.width = r.get_int("key_grid_width", 0);
    positive("key_grid_height", geo.key_grid.height);
    positive("key_grid_width", geo.key_grid.width);
    if (geo.key_grid.height > geo.grid.height || geo.key_grid.width > geo.grid.width) {
      r.bad("attribute 'key_grid_height'",
            "a key grid no larger than the " + std::to_string(geo.grid.height) + "x" +
                std::to_string(geo.grid.width) + " query grid",
            std::to_string(geo.key_grid.height) + "x" + std::to_string(geo.key_grid.width));
    }
  }
  const int key_tokens = r.get_int("key_tokens", geo.key_grid.tokens());
  if (key_tokens != geo.key_grid.tokens()) {
    r.bad("attribute 'key_tokens'",
          "prefix_tokens + key_grid_height * key_grid_width = " +
              std::to_string(geo.key_grid.tokens()),
          std::to_string(key_tokens));
  }
  if (r.has("windows") || r.has("window_height") || r.has("window_width")) {
    geo.windows = r.get_int("windows", 0);
    geo.window_height = r.get_int("window_height", 0);
    geo.window_width = r.get_int("window_width", 0);
    geo.shift = r.get_int("shift", 0);
    positive("windows", geo.windows);
    positive("window_height", geo.window_height);
    positive("window_width", geo.window_width);
    if (geo.shift < 0) r.bad("attribute 'shift'", "an integer >= 0", std::to_string(geo.shift));
    if (has_kh) {
      r.bad("attribute 'key_grid_height'", "no key grid on a layer with windows (keys are the "
            "window's own tokens)", std::to_string(geo.key_grid.height));
    }
    if (geo.grid.prefix != 0) {
      r.bad("attribute 'prefix_tokens'", "0 on a layer with windows", std::to_string(geo.grid.prefix));
    }
    read_windows(file_id, r, geo);
    read_second_shape(file_id, r, geo);
  } else if (r.has("second_heads_from")) {
    r.bad("attribute 'second_heads_from'", "windows (windows, window_height, window_width) with it",
          "a second stripe shape alone");
  } else if (r.has("shift")) {
    r.bad("attribute 'shift'", "windows (windows, window_height, window_width) with it", "a shift alone");
  }
  return geo;
}

}  // namespace attnscope::dump_detail
