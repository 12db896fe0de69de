// attnscope rollout: attention rollout over the selected layers (heads fused, identity added, rows
// normalised, layers multiplied); the CLS row as a grid map per image and averaged over images.
#include "command.hpp"
#include "common.hpp"
#include "diagnostic_options.hpp"
#include "attnscope/run/image_run.hpp"
#include "selection_flags.hpp"

#include "attnscope/analyses/rollout.hpp"

#include <iomanip>
#include <iostream>

namespace attnscope::app {
namespace {

struct RolloutFlags {
  CommonOptions common;
  SelectionFlags sel;
  std::string fusion = "mean";
  bool reference = false;
  RunControl control;
};

po::options_description rollout_options(RolloutFlags& f) {
  po::options_description d("options");
  add_diagnostic_input_options(d, f.common, f.sel, "results/rollout");
  d.add_options()
      ("fusion", po::value(&f.fusion)->value_name("mean|max|min")->default_value(f.fusion),
       "how a layer's selected heads are fused before the identity is added")
      ("reference", po::bool_switch(&f.reference), "plain double-precision loops (slow; for checks)");
  add_diagnostic_run_options(d, f.common, f.control);
  return d;
}

nlohmann::json to_record(const analyses::RolloutImage& img) {
  return {{"cls", img.cls}, {"fixed_rows", img.fixed_rows}, {"degenerate_rows", img.degenerate_rows}};
}

analyses::RolloutImage from_record(int image, const nlohmann::json& r, std::size_t variants, int tokens) {
  analyses::RolloutImage img;
  img.image = image;
  img.cls = r.at("cls").get<std::vector<std::vector<double>>>();
  img.fixed_rows = r.at("fixed_rows").get<std::vector<std::int64_t>>();
  img.degenerate_rows = r.at("degenerate_rows").get<std::vector<std::int64_t>>();
  bool ok = img.cls.size() == variants && img.fixed_rows.size() == variants && img.degenerate_rows.size() == variants;
  for (const auto& row : img.cls) ok = ok && row.size() == static_cast<std::size_t>(tokens);
  if (!ok) throw Error("rollout: image " + std::to_string(image) + ": a malformed record");
  return img;
}

std::string cell_of(const TokenGrid& g, int t) {
  return g.on_grid(t) ? std::to_string(g.row(t)) + "," + std::to_string(g.col(t)) : "-1,-1";
}

int run_rollout_cmd(const std::vector<std::string>& args) {
  RolloutFlags f;
  const po::options_description desc = rollout_options(f);
  po::variables_map vm;
  if (!parse_args("rollout", "--dump FILE [options]", desc, args, vm)) return 0;
  const analyses::HeadFusion fusion = analyses::parse_head_fusion(f.fusion);
  const int threads = apply_threads(f.common.threads);
  const ResolvedDevice device = apply_device("rollout", f.common, false);
  DumpReader reader(f.common.dump);
  const DumpSchema& schema = reader.schema();
  const TokenGrid grid = schema.attrs.grid;
  const int tokens = schema.attrs.num_tokens;
  if (grid.prefix < 1) {
    throw InputError(schema.path, "attribute 'prefix_tokens'",
                     "at least 1: a CLS token, whose row of the rollout is the map", "0");
  }
  std::map<int, std::string> own_names;  // each layer's own variant's, on a hybrid dump
  const analyses::Selection sel =
      with_own_variants(make_selection(f.sel, schema, f.common.seed), f.common, schema, own_names,
                        "the rollout multiplies every layer's token-to-token N x N matrices "
                        "through the model: windows, keys from a reduced grid and token counts "
                        "that change between stages (patch merging) leave that product undefined");
  const std::vector<Variant> variants = resolve_variants(f.common, schema, sel.layers);
  const std::filesystem::path dir = ensure_out_dir(f.common.out);

  RunMetadata meta("rollout");
  meta.inputs() = {{"dump", f.common.dump}};
  meta.params() =
      diagnostic_params(variants, sel, schema, f.reference, threads, f.common, device, own_names);
  meta.params().update({{"fusion", analyses::to_string(fusion)},
                        {"layers_in_order", model_layers_of(schema, analyses::layers_in_model_order(schema, sel.layers))},
                        {"step", "A = rownorm(fuse(W_heads) + I); R = A_last ... A_first; the map: R's row of token 0"}});
  ImageRun run(f.control, "rollout", command_args(args), dir, run_fingerprint("rollout", f.common.dump, meta.params()),
               sel.images);
  ImageTimer timer;
  run.compute([&] {
    analyses::Selection part = sel;
    part.images = run.pending();
    Progress progress("rollout", part.images.size());
    analyses::rollout_images(reader, part, variants, fusion, f.reference, [&](analyses::RolloutImage&& img) {
      run.record(img.image, to_record(img));
      timer.tick();
      progress.tick();
    });
    progress.finish();
  });

  std::unique_ptr<ResultSet> set;
  std::unique_ptr<ResultFile> maps;
  auto open_set = [&] {
    if (set) return;
    set = std::make_unique<ResultSet>(dir, "rollout.json");
    maps = std::make_unique<ResultFile>(*set, "rollout.csv");
    maps->stream() << "variant,image,token,grid_row,grid_col,value\n" << std::setprecision(10);
  };
  std::vector<std::vector<double>> sum(variants.size(), std::vector<double>(static_cast<std::size_t>(tokens), 0.0));
  std::vector<std::int64_t> fixed(variants.size(), 0), degenerate(variants.size(), 0);
  std::int64_t images = 0;
  // A rollout runs through every layer: with each layer's own variant it is "each_layer_own".
  auto name = [&](std::size_t v) {
    return analyses::all_layers_variant_name(own_names, variants[v]);
  };
  auto apply = [&](int image, const nlohmann::json& rec) {
    open_set();
    const analyses::RolloutImage img = from_record(image, rec, variants.size(), tokens);
    for (std::size_t v = 0; v < variants.size(); ++v) {
      for (int t = 0; t < tokens; ++t) {
        const double x = img.cls[v][static_cast<std::size_t>(t)];
        sum[v][static_cast<std::size_t>(t)] += x;
        maps->stream() << name(v) << "," << image << "," << t << "," << cell_of(grid, t) << "," << x
                       << "\n";
      }
      fixed[v] += img.fixed_rows[v];
      degenerate[v] += img.degenerate_rows[v];
    }
    ++images;
  };
  nlohmann::json per_variant = nlohmann::json::array();
  auto publish = [&] {
    const auto rows_per_image =
        static_cast<std::int64_t>(sel.layers.size() * sel.heads.size()) * static_cast<std::int64_t>(tokens);
    std::int64_t measured = 0;
    for (std::size_t v = 0; v < variants.size(); ++v) measured += images * rows_per_image - degenerate[v];
    require_measured_rows(measured, "there is no attention to roll out");
    open_set();
    maps->close();
    ResultFile mean(*set, "rollout_mean.csv");
    mean.stream() << "variant,token,grid_row,grid_col,mean\n" << std::setprecision(10);
    for (std::size_t v = 0; v < variants.size(); ++v) {
      double prefix = 0.0;
      int top = grid.prefix;
      for (int t = 0; t < tokens; ++t) {
        const double m = sum[v][static_cast<std::size_t>(t)] / static_cast<double>(images);
        mean.stream() << name(v) << "," << t << "," << cell_of(grid, t) << "," << m << "\n";
        if (t < grid.prefix) prefix += m;
        if (t >= grid.prefix && sum[v][static_cast<std::size_t>(t)] > sum[v][static_cast<std::size_t>(top)]) top = t;
      }
      per_variant.push_back(
          {{"variant", name(v)},
           {"cls_to_prefix", prefix},
           {"cls_to_grid", 1.0 - prefix},
           {"top_grid_token", top},
           {"top_grid_cell", {grid.row(top), grid.col(top)}},
           {"top_grid_mean", sum[v][static_cast<std::size_t>(top)] / static_cast<double>(images)},
           {"rows_replaced_by_identity", fixed[v]},
           {"degenerate_rows", degenerate[v]}});
    }
    mean.close();
    meta.results() = {{"images", images}, {"variants", per_variant}, {"ms_per_image", timer.summary()}};
    meta.publish(*set);
  };
  if (!run.finish(apply, publish)) return 0;
  std::cout << "attention rollout (" << images << " images; " << analyses::to_string(fusion) << " over "
            << sel.heads.size() << " heads, " << sel.layers.size() << " layers): the CLS row's mass\n"
            << std::left << std::setw(28) << "variant" << "on prefix tokens  on the grid  top grid cell (mean)\n";
  for (const auto& j : per_variant) {
    std::cout << std::setw(28) << j["variant"].get<std::string>() << std::fixed << std::setprecision(4)
              << std::setw(18) << j["cls_to_prefix"].get<double>() << std::setw(13) << j["cls_to_grid"].get<double>()
              << "(" << j["top_grid_cell"][0] << ", " << j["top_grid_cell"][1] << ") "
              << j["top_grid_mean"].get<double>() << std::defaultfloat << "\n";
  }
  return 0;
}

const CommandRegistration kRegistration{
    {"rollout", "attention rollout over layers (heads fused, identity added); the CLS row as a grid map per image",
     run_rollout_cmd, true}};

}  // namespace
}  // namespace attnscope::app
