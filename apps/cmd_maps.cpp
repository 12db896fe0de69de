// attnscope maps: attention rows of chosen query tokens as H x W grid maps (HDF5 and CSV), the
// input of the papers' attention-map figures.
#include "command.hpp"
#include "common.hpp"
#include "attnscope/run/image_run.hpp"
#include "selection_flags.hpp"

#include "attnscope/analyses/maps.hpp"
#include "attnscope/hdf5_writer.hpp"

#include <iostream>
#include <memory>

namespace attnscope::app {
namespace {

struct MapsFlags {
  CommonOptions common;
  SelectionFlags sel;
  std::string tokens;
  RunControl control;
};

po::options_description maps_options(MapsFlags& f) {
  po::options_description d("options");
  add_dump_option(d, f.common);
  add_out_option(d, f.common, "results/maps");
  add_variant_option(d, f.common, dumps_own_variant(true));
  add_selection_options(d, f.sel, true, "0");
  d.add_options()("tokens", po::value(&f.tokens)->value_name("LIST")->required(),
                  "query tokens: indices (0 = first prefix token) or grid cells ROW:COL, e.g. 0,7:7");
  add_threads_option(d, f.common);
  add_device_option(d, f.common);
  add_seed_option(d, f.common);
  add_run_control_options(d, f.control);
  return d;
}

/// An image's record: its degenerate rows and its maps, each [variant, layer (the dump's index),
/// head, token, query_row, query_col, grid (row-major), prefix weights].
nlohmann::json to_record(const analyses::MapsImage& img) {
  nlohmann::json maps = nlohmann::json::array();
  for (const analyses::MapEntry& e : img.maps) {
    const analyses::AttentionMap& m = e.map;
    maps.push_back({e.variant, e.layer, e.head, m.token, m.query_row, m.query_col,
                    std::vector<double>(m.grid.data(), m.grid.data() + m.grid.size()), m.prefix});
  }
  return {{"degenerate_rows", img.degenerate_rows}, {"maps", std::move(maps)}};
}

/// The grid a map of dump layer `layer` is laid out on: its keys' (the dump's grid for layers of
/// the dump's geometry; the reduced grid, or the stage's grid of a layer with windows).
TokenGrid map_grid(const DumpSchema& schema, int layer) {
  const LayerGeometry g = schema.geometry(layer);
  TokenGrid grid = g.key_grid;
  if (g.windows > 0) grid.prefix = 0;
  return grid;
}

analyses::MapsImage from_record(int image, const nlohmann::json& r, const DumpSchema& schema,
                                std::size_t variants) {
  analyses::MapsImage img;
  img.image = image;
  const auto bad = [image] { return Error("maps: a malformed record of image " + std::to_string(image)); };
  if (!r.is_object() || !r.contains("maps") || !r.contains("degenerate_rows")) throw bad();
  img.degenerate_rows = r.at("degenerate_rows").get<long long>();
  for (const nlohmann::json& j : r.at("maps")) {
    if (!j.is_array() || j.size() != 8) throw bad();
    analyses::MapEntry e;
    e.variant = j[0].get<std::size_t>();
    e.image = image;
    e.layer = j[1].get<int>();
    e.head = j[2].get<int>();
    e.map.token = j[3].get<int>();
    e.map.query_row = j[4].get<int>();
    e.map.query_col = j[5].get<int>();
    const auto cells = j[6].get<std::vector<double>>();
    e.map.prefix = j[7].get<std::vector<double>>();
    if (e.layer < 0 || e.layer >= schema.attrs.num_layers) throw bad();
    const TokenGrid grid = map_grid(schema, e.layer);
    if (e.variant >= variants || cells.size() != static_cast<std::size_t>(grid.height) * grid.width ||
        e.map.prefix.size() != static_cast<std::size_t>(grid.prefix)) {
      throw bad();
    }
    e.map.grid = Eigen::Map<const MatD>(cells.data(), grid.height, grid.width);
    img.maps.push_back(std::move(e));
  }
  return img;
}

int run_maps_cmd(const std::vector<std::string>& args) {
  MapsFlags f;
  const po::options_description desc = maps_options(f);
  po::variables_map vm;
  if (!parse_args("maps", "--dump FILE --tokens LIST [options]", desc, args, vm)) return 0;
  const int threads = apply_threads(f.common.threads);
  const ResolvedDevice device = apply_device("maps", f.common, false);
  DumpReader reader(f.common.dump);
  const DumpSchema& schema = reader.schema();
  const TokenGrid grid = schema.attrs.grid;
  analyses::Selection sel = make_selection(f.sel, schema, f.common.seed);
  const std::vector<Variant> variants = resolve_variants(f.common, schema, sel.layers);
  sel.own_variants = layers_own_variants(f.common, schema, sel.layers);
  const std::map<int, std::string> own_names = own_variant_names(schema, sel.own_variants, sel.layers);
  const std::vector<int> tokens = analyses::parse_tokens(f.tokens, grid);
  const std::filesystem::path dir = ensure_out_dir(f.common.out);
  run::check_result_path(dir / "maps.h5");  // an HDF5 result: it could be the dump itself

  RunMetadata meta("maps");
  meta.inputs() = {{"dump", f.common.dump}};
  meta.params() = {{"variants", variants_json(variants, own_names)}, {"tokens", tokens}, {"images", sel.images},
                   {"layers", model_layers_of(schema, sel.layers)}, {"heads", sel.heads}, {"transform", sel.transform.name()},
                   {"threads", threads}, {"seed", f.common.seed}};
  meta.params()["device"] = device.description;
  if (const nlohmann::json geo = layer_geometry_json(schema, sel.layers); !geo.is_null()) {
    meta.params()["layer_geometry"] = geo;
  }
  ImageRun run(f.control, "maps", command_args(args), dir, run_fingerprint("maps", f.common.dump, meta.params()),
               sel.images);
  run.compute([&] {
    analyses::Selection part = sel;
    part.images = run.pending();
    Progress progress("maps", part.images.size());
    analyses::maps_images(reader, part, variants, tokens, [&](analyses::MapsImage&& img) {
      run.record(img.image, to_record(img));
      progress.tick();
    });
    progress.finish();
  });

  std::unique_ptr<ResultSet> set;
  std::unique_ptr<ResultFile> csv;
  std::unique_ptr<Hdf5Writer> h5;
  auto open_set = [&] {
    if (set) return;
    set = std::make_unique<ResultSet>(dir, "maps.json");
    csv = std::make_unique<ResultFile>(*set, "maps.csv");
    csv->stream() << "variant,image,layer,head,query,query_row,query_col,row,col,weight\n";
    csv->stream().precision(17);
    h5 = std::make_unique<Hdf5Writer>(set->stage("maps.h5"), set->final_path("maps.h5").string());
    h5->write_root_attributes(
        {{{"grid_height", grid.height}, {"grid_width", grid.width}, {"prefix_tokens", grid.prefix}}, {}});
  };
  long long written = 0, degenerate = 0;
  auto apply = [&](int image, const nlohmann::json& rec) {
    open_set();
    const analyses::MapsImage img = from_record(image, rec, schema, variants.size());
    for (const analyses::MapEntry& e : img.maps) {
      const int layer = schema.model_layer(e.layer);
      const std::string name = analyses::row_variant_name(own_names, variants[e.variant], layer);
      const analyses::AttentionMap& m = e.map;
      h5->write_matrix("/" + name + "/image_" + std::to_string(e.image) + "/layer_" + std::to_string(layer) +
                           "/head_" + std::to_string(e.head) + "/query_" + std::to_string(m.token),
                       m.grid,
                       {{{"token", m.token}, {"query_row", m.query_row}, {"query_col", m.query_col}},
                        {{"prefix_weights", m.prefix}}});
      for (Eigen::Index r = 0; r < m.grid.rows(); ++r) {
        for (Eigen::Index c = 0; c < m.grid.cols(); ++c) {
          csv->stream() << name << "," << e.image << "," << layer << "," << e.head << "," << m.token << ","
                        << m.query_row << "," << m.query_col << "," << r << "," << c << "," << m.grid(r, c)
                        << "\n";
        }
      }
    }
    written += static_cast<long long>(img.maps.size());
    degenerate += img.degenerate_rows;
  };
  auto publish = [&] {
    if (written == 0) {
      throw NothingToMeasure("no valid queries: the row of every selected query is degenerate (a "
                             "zero or tiny denominator), so there is no map to draw");
    }
    open_set();
    h5->close();
    csv->close();
    meta.results() = {{"maps", written}, {"degenerate_rows_skipped", degenerate},
                      {"files", {"maps.csv", "maps.h5"}}};
    meta.publish(*set);
  };
  if (!run.finish(apply, publish)) return 0;
  std::cout << "wrote " << written << " maps (" << grid.height << "x" << grid.width << ") to " << (dir / "maps.h5").string()
            << " and maps.csv\n";
  if (degenerate > 0) {
    std::cout << "skipped " << degenerate << " degenerate rows (a zero or tiny denominator: no weights)\n";
  }
  return 0;
}

const CommandRegistration kRegistration{
    {"maps", "attention rows of chosen query tokens as H x W grid maps (HDF5 and CSV)", run_maps_cmd, true}};

}  // namespace
}  // namespace attnscope::app
