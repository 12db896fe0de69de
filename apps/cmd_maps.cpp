// attnscope maps: attention rows of chosen query tokens as H x W grid maps (HDF5 and CSV), the
// input of the papers' attention-map figures.
#include "command.hpp"
#include "common.hpp"
#include "selection_flags.hpp"

#include "attnscope/analyses/head_error.hpp"
#include "attnscope/analyses/maps.hpp"

#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <mutex>
#include <tuple>

namespace attnscope::app {
namespace {

struct MapsFlags {
  CommonOptions common;
  SelectionFlags sel;
  std::string tokens;
};

po::options_description maps_options(MapsFlags& f) {
  po::options_description d("options");
  add_dump_option(d, f.common);
  add_out_option(d, f.common, "results/maps");
  add_variant_option(d, f.common);
  f.sel.images = "0";
  add_selection_options(d, f.sel, true);
  d.add_options()("tokens", po::value(&f.tokens)->value_name("LIST")->required(),
                  "query tokens: indices (0 = first prefix token) or grid cells ROW:COL, e.g. 0,7:7");
  add_threads_option(d, f.common);
  add_seed_option(d, f.common);
  return d;
}

/// A small HDF5 writer for the maps file: written under a temporary name, renamed by commit().
class MapsH5 {
 public:
  explicit MapsH5(std::filesystem::path path)
      : path_(std::move(path)), tmp_(path_.string() + ".tmp-" + std::to_string(::getpid())) {
    file_ = H5Fcreate(tmp_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (file_ < 0) throw InputError(tmp_.string(), "/", "a writable HDF5 file", "cannot create it");
    lcpl_ = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl_, 1);
  }
  ~MapsH5() {
    close();
    if (!committed_) std::filesystem::remove(tmp_);
  }
  MapsH5(const MapsH5&) = delete;
  MapsH5& operator=(const MapsH5&) = delete;

  void write_map(const std::string& name, const analyses::AttentionMap& m) {
    const hsize_t dims[2] = {static_cast<hsize_t>(m.grid.rows()), static_cast<hsize_t>(m.grid.cols())};
    const hid_t space = H5Screate_simple(2, dims, nullptr);
    const hid_t ds = H5Dcreate2(file_, name.c_str(), H5T_IEEE_F64LE, space, lcpl_, H5P_DEFAULT, H5P_DEFAULT);
    H5Sclose(space);
    if (ds < 0 || H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, m.grid.data()) < 0) {
      if (ds >= 0) H5Dclose(ds);
      throw InputError(tmp_.string(), name, "a writable dataset", "HDF5 write failed");
    }
    int_attr(ds, "token", m.token);
    int_attr(ds, "query_row", m.query_row);
    int_attr(ds, "query_col", m.query_col);
    double_attr(ds, "prefix_weights", m.prefix);
    H5Dclose(ds);
  }
  void root_int(const char* name, int v) { int_attr(file_, name, v); }
  void commit() {
    close();
    std::filesystem::rename(tmp_, path_);
    committed_ = true;
  }

 private:
  static void int_attr(hid_t obj, const char* name, int v) {
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t a = H5Acreate2(obj, name, H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT, &v);
    H5Aclose(a);
    H5Sclose(space);
  }
  static void double_attr(hid_t obj, const char* name, const std::vector<double>& v) {
    const hsize_t n = v.size();
    const hid_t space = n ? H5Screate_simple(1, &n, nullptr) : H5Screate(H5S_NULL);
    const hid_t a = H5Acreate2(obj, name, H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    if (n) H5Awrite(a, H5T_NATIVE_DOUBLE, v.data());
    H5Aclose(a);
    H5Sclose(space);
  }
  void close() {
    if (lcpl_ >= 0) H5Pclose(lcpl_);
    if (file_ >= 0) H5Fclose(file_);
    lcpl_ = file_ = -1;
  }
  std::filesystem::path path_, tmp_;
  hid_t file_ = -1, lcpl_ = -1;
  bool committed_ = false;
};

struct MapEntry {
  std::size_t variant = 0;
  int image = 0, layer = 0, head = 0;
  analyses::AttentionMap map;
};

int run_maps_cmd(const std::vector<std::string>& args) {
  MapsFlags f;
  const po::options_description desc = maps_options(f);
  po::variables_map vm;
  if (!parse_args("maps", "--dump FILE --tokens LIST [options]", desc, args, vm)) return 0;
  const int threads = apply_threads(f.common.threads);
  DumpReader reader(f.common.dump);
  const DumpSchema& schema = reader.schema();
  const TokenGrid grid = schema.attrs.grid;
  analyses::Selection sel = make_selection(f.sel, schema, f.common.seed);
  sel.need_v = false;  // maps are weights only
  const std::vector<Variant> variants = selected_variants(f.common.variant, schema, f.common.seed);
  const std::vector<int> tokens = analyses::parse_tokens(f.tokens, grid);
  const std::filesystem::path dir = ensure_out_dir(f.common.out);

  RunMetadata meta("maps");
  meta.inputs() = {{"dump", f.common.dump}};
  meta.params() = {{"variants", variant_names(variants)}, {"tokens", tokens}, {"images", sel.images},
                   {"layers", sel.layers}, {"heads", sel.heads}, {"transform", sel.transform.name()},
                   {"threads", threads}, {"seed", f.common.seed}};
  AtomicFile csv(dir / "maps.csv");
  csv.stream() << "variant,image,layer,head,query,query_row,query_col,row,col,weight\n";
  csv.stream().precision(17);
  MapsH5 h5(dir / "maps.h5");
  h5.root_int("grid_height", grid.height);
  h5.root_int("grid_width", grid.width);
  h5.root_int("prefix_tokens", grid.prefix);

  std::vector<MapEntry> pending;
  std::mutex pending_mutex;
  auto on_head = [&](const analyses::HeadView& hv) {
    for (std::size_t v = 0; v < variants.size(); ++v) {
      const analyses::ExactRows rows = analyses::in_head(hv.image, hv.layer, hv.head, [&] {
        return analyses::ExactRows(variants[v], hv.q, hv.k, schema.attrs.scale);
      });
      for (int t : tokens) {
        MapEntry e{v, hv.image, hv.layer, hv.head, analyses::attention_map(rows, grid, t)};
        std::lock_guard<std::mutex> lock(pending_mutex);
        pending.push_back(std::move(e));
      }
    }
  };
  std::size_t written = 0;
  Progress progress("maps", sel.images.size());
  auto on_image = [&](int) {
    std::sort(pending.begin(), pending.end(), [](const MapEntry& a, const MapEntry& b) {
      return std::tie(a.variant, a.layer, a.head, a.map.token) < std::tie(b.variant, b.layer, b.head, b.map.token);
    });
    for (const MapEntry& e : pending) {
      const std::string name = variants[e.variant].name();
      h5.write_map("/" + name + "/image_" + std::to_string(e.image) + "/layer_" + std::to_string(e.layer) +
                       "/head_" + std::to_string(e.head) + "/query_" + std::to_string(e.map.token),
                   e.map);
      for (Eigen::Index r = 0; r < e.map.grid.rows(); ++r) {
        for (Eigen::Index c = 0; c < e.map.grid.cols(); ++c) {
          csv.stream() << name << "," << e.image << "," << e.layer << "," << e.head << "," << e.map.token << ","
                       << e.map.query_row << "," << e.map.query_col << "," << r << "," << c << ","
                       << e.map.grid(r, c) << "\n";
        }
      }
    }
    written += pending.size();
    pending.clear();
    progress.tick();
  };
  analyses::for_each_head(reader, sel, on_head, on_image);
  progress.finish();
  h5.commit();
  csv.commit();
  meta.results() = {{"maps", written}, {"files", {"maps.csv", "maps.h5"}}};
  meta.write(dir);
  std::cout << "wrote " << written << " maps (" << grid.height << "x" << grid.width << ") to " << (dir / "maps.h5").string()
            << " and maps.csv\n";
  return 0;
}

const CommandRegistration kRegistration{
    {"maps", "attention rows of chosen query tokens as H x W grid maps (HDF5 and CSV)", run_maps_cmd}};

}  // namespace
}  // namespace attnscope::app
