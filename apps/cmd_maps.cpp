// attnscope maps: attention rows of chosen query tokens as H x W grid maps (HDF5 and CSV), the
// input of the papers' attention-map figures.
#include "command.hpp"
#include "common.hpp"
#include "maps_h5.hpp"
#include "selection_flags.hpp"

#include "attnscope/analyses/head_error.hpp"
#include "attnscope/analyses/maps.hpp"

#include <algorithm>
#include <atomic>
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
  add_selection_options(d, f.sel, true, "0");
  d.add_options()("tokens", po::value(&f.tokens)->value_name("LIST")->required(),
                  "query tokens: indices (0 = first prefix token) or grid cells ROW:COL, e.g. 0,7:7");
  add_threads_option(d, f.common);
  add_seed_option(d, f.common);
  return d;
}

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
  const std::vector<Variant> variants = resolve_variants(f.common, schema);
  const std::vector<int> tokens = analyses::parse_tokens(f.tokens, grid);
  const std::filesystem::path dir = ensure_out_dir(f.common.out);

  RunMetadata meta("maps");
  meta.inputs() = {{"dump", f.common.dump}};
  meta.params() = {{"variants", variant_names(variants)}, {"tokens", tokens}, {"images", sel.images},
                   {"layers", model_layers_of(schema, sel.layers)}, {"heads", sel.heads}, {"transform", sel.transform.name()},
                   {"threads", threads}, {"seed", f.common.seed}};
  ResultSet set(dir, "maps.json");
  ResultFile csv(set, "maps.csv");
  csv.stream() << "variant,image,layer,head,query,query_row,query_col,row,col,weight\n";
  csv.stream().precision(17);
  MapsH5 h5(set.stage("maps.h5"), set.final_path("maps.h5"));
  h5.root_int("grid_height", grid.height);
  h5.root_int("grid_width", grid.width);
  h5.root_int("prefix_tokens", grid.prefix);

  std::vector<MapEntry> pending;
  std::mutex pending_mutex;
  std::atomic<long long> degenerate{0};  // rows without weights: no map rather than a map of zeros
  auto on_head = [&](const analyses::HeadView& hv) {
    for (std::size_t v = 0; v < variants.size(); ++v) {
      const analyses::ExactRows rows = analyses::in_head(hv.image, hv.layer, hv.head, [&] {
        return analyses::ExactRows(variants[v], hv.q, hv.k, schema.attrs.scale);
      });
      for (int t : tokens) {
        if (rows.degenerate(t)) {
          degenerate.fetch_add(1);
          continue;
        }
        MapEntry e{v, hv.image, schema.model_layer(hv.layer), hv.head,
                   analyses::attention_map(rows, grid, t)};
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
  if (written == 0) {
    throw NothingToMeasure("no valid queries: the row of every selected query is degenerate (a "
                           "zero or tiny denominator), so there is no map to draw");
  }
  h5.close();
  csv.close();
  meta.results() = {{"maps", written}, {"degenerate_rows_skipped", degenerate.load()},
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
