// attnscope maps: attention rows of chosen query tokens as H x W grid maps (HDF5 and CSV), the
// input of the papers' attention-map figures.
#include "command.hpp"
#include "common.hpp"
#include "selection_flags.hpp"

#include "attnscope/analyses/maps.hpp"
#include "attnscope/hdf5_writer.hpp"

#include <iostream>

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
  add_selection_options(d, f.sel, true, "0");
  d.add_options()("tokens", po::value(&f.tokens)->value_name("LIST")->required(),
                  "query tokens: indices (0 = first prefix token) or grid cells ROW:COL, e.g. 0,7:7");
  add_threads_option(d, f.common);
  add_device_option(d, f.common);
  add_seed_option(d, f.common);
  return d;
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
  const analyses::Selection sel = make_selection(f.sel, schema, f.common.seed);
  const std::vector<Variant> variants = resolve_variants(f.common, schema);
  const std::vector<int> tokens = analyses::parse_tokens(f.tokens, grid);
  const std::filesystem::path dir = ensure_out_dir(f.common.out);

  RunMetadata meta("maps");
  meta.inputs() = {{"dump", f.common.dump}};
  meta.params() = {{"variants", variant_names(variants)}, {"tokens", tokens}, {"images", sel.images},
                   {"layers", model_layers_of(schema, sel.layers)}, {"heads", sel.heads}, {"transform", sel.transform.name()},
                   {"threads", threads}, {"seed", f.common.seed}};
  meta.params()["device"] = device.description;
  ResultSet set(dir, "maps.json");
  ResultFile csv(set, "maps.csv");
  csv.stream() << "variant,image,layer,head,query,query_row,query_col,row,col,weight\n";
  csv.stream().precision(17);
  Hdf5Writer h5(set.stage("maps.h5"), set.final_path("maps.h5").string());
  h5.write_root_attributes(
      {{{"grid_height", grid.height}, {"grid_width", grid.width}, {"prefix_tokens", grid.prefix}}, {}});
  Progress progress("maps", sel.images.size());
  auto write_image = [&](int, const std::vector<analyses::MapEntry>& maps) {
    for (const analyses::MapEntry& e : maps) {
      const std::string name = variants[e.variant].name();
      const int layer = schema.model_layer(e.layer);
      const analyses::AttentionMap& m = e.map;
      h5.write_matrix("/" + name + "/image_" + std::to_string(e.image) + "/layer_" + std::to_string(layer) +
                          "/head_" + std::to_string(e.head) + "/query_" + std::to_string(m.token),
                      m.grid,
                      {{{"token", m.token}, {"query_row", m.query_row}, {"query_col", m.query_col}},
                       {{"prefix_weights", m.prefix}}});
      for (Eigen::Index r = 0; r < m.grid.rows(); ++r) {
        for (Eigen::Index c = 0; c < m.grid.cols(); ++c) {
          csv.stream() << name << "," << e.image << "," << layer << "," << e.head << "," << m.token << ","
                       << m.query_row << "," << m.query_col << "," << r << "," << c << "," << m.grid(r, c)
                       << "\n";
        }
      }
    }
    progress.tick();
  };
  const analyses::MapsRun run = analyses::run_maps(reader, sel, variants, tokens, write_image);
  progress.finish();
  const long long written = run.maps, degenerate = run.degenerate_rows;
  if (written == 0) {
    throw NothingToMeasure("no valid queries: the row of every selected query is degenerate (a "
                           "zero or tiny denominator), so there is no map to draw");
  }
  h5.close();
  csv.close();
  meta.results() = {{"maps", written}, {"degenerate_rows_skipped", degenerate},
                    {"files", {"maps.csv", "maps.h5"}}};
  meta.publish(set);
  std::cout << "wrote " << written << " maps (" << grid.height << "x" << grid.width << ") to " << (dir / "maps.h5").string()
            << " and maps.csv\n";
  if (degenerate > 0) {
    std::cout << "skipped " << degenerate << " degenerate rows (a zero or tiny denominator: no weights)\n";
  }
  return 0;
}

const CommandRegistration kRegistration{
    {"maps", "attention rows of chosen query tokens as H x W grid maps (HDF5 and CSV)", run_maps_cmd}};

}  // namespace
}  // namespace attnscope::app
