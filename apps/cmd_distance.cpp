// attnscope distance: mean attention distance per layer and head, in pixels, as the ViT papers
// compute it (prefix tokens dropped, rows not renormalised by default), and its distribution.
#include "command.hpp"
#include "common.hpp"
#include "diagnostic_options.hpp"
#include "attnscope/run/image_run.hpp"
#include "query_stats_record.hpp"
#include "selection_flags.hpp"

#include "attnscope/analyses/distance.hpp"

#include <iomanip>
#include <iostream>

namespace attnscope::app {
namespace {

struct DistanceFlags {
  CommonOptions common;
  SelectionFlags sel;
  double patch_size = 0.0;  // 0: from /images, else patches
  analyses::DistanceOptions opt;
  int bins = 32;
  bool reference = false;
  RunControl control;
};

po::options_description distance_options(DistanceFlags& f) {
  po::options_description d("options");
  add_diagnostic_input_options(d, f.common, f.sel, "results/distance");
  d.add_options()
      ("patch-size", po::value(&f.patch_size)->value_name("PIXELS"),
       "patch size in pixels (default: the dump's /images size over the grid; without /images, 1: "
       "distances in patches)")
      ("renormalise", po::bool_switch(&f.opt.renormalise),
       "divide each row by its mass on the grid keys (default: the weights as given, CLS column "
       "dropped)")
      ("bins", po::value(&f.bins)->value_name("B")->default_value(f.bins),
       "histogram bins over [0, the grid's largest distance]")
      ("reference", po::bool_switch(&f.reference), "plain double-precision loops (slow; for checks)");
  add_diagnostic_run_options(d, f.common, f.control);
  return d;
}

void print_summary(const analyses::QueryStatsResult& r, const analyses::PatchSize& p, bool renormalise,
                   double uniform) {
  std::cout << "mean attention distance in pixels (" << r.images << " images; patch " << p.height << "x" << p.width
            << " px from " << p.source << "; prefix tokens dropped, rows "
            << (renormalise ? "renormalised over the grid" : "not renormalised") << "; uniform rows: "
            << std::setprecision(4) << uniform << ")\n"
            << std::left << std::setw(28) << "variant" << "per layer, mean over heads\n";
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    std::cout << std::setw(28)
              << analyses::all_layers_variant_name(r.layer_variant_names, r.variants[v]);
    for (const auto& [layer, mean] : layer_means(r.cells[v], 0)) {
      std::cout << " " << std::fixed << std::setprecision(3) << mean;
    }
    std::cout << std::defaultfloat << "\n";
    std::int64_t negative = 0;
    for (const auto& c : r.cells[v]) negative += c.counters[1];
    if (negative > 0) {
      std::cout << "  (" << negative << " rows with negative weights: signed sums, weights as given)\n";
    }
  }
}

int run_distance_cmd(const std::vector<std::string>& args) {
  DistanceFlags f;
  const po::options_description desc = distance_options(f);
  po::variables_map vm;
  if (!parse_args("distance", "--dump FILE [options]", desc, args, vm)) return 0;
  if (vm.count("patch-size") != 0 && !(f.patch_size > 0.0)) {
    throw UsageError("--patch-size: expected a positive size in pixels, found " + std::to_string(f.patch_size));
  }
  if (f.bins < 1 || f.bins > 1000000) {
    throw UsageError("--bins: expected 1 to 1000000 bins, found " + std::to_string(f.bins));
  }
  const int threads = apply_threads(f.common.threads);
  const ResolvedDevice device = apply_device("distance", f.common, false);
  DumpReader reader(f.common.dump);
  const DumpSchema& schema = reader.schema();
  std::map<int, std::string> own_names;  // each layer's own variant's, on a hybrid dump
  analyses::Selection sel = with_own_variants(make_selection(f.sel, schema, f.common.seed),
                                              f.common, schema, own_names, "");
  sel.any_geometry = true;  // windows, reduced keys and stages in their own grid's pixels
  const std::vector<Variant> variants = resolve_variants(f.common, schema, sel.layers);
  const analyses::PatchSize patch = analyses::patch_size_of(reader, f.patch_size);
  const analyses::PatchGeometry geometry(schema.attrs.grid, patch.height, patch.width);
  const analyses::QueryStatsLayout layout = analyses::distance_layout(geometry, f.bins);
  const std::filesystem::path dir = ensure_out_dir(f.common.out);

  nlohmann::json patch_json = {{"height", patch.height}, {"width", patch.width}, {"source", patch.source}};
  if (patch.images_height > 0.0) {
    patch_json["images_height"] = patch.images_height;
    patch_json["images_width"] = patch.images_width;
  }
  RunMetadata meta("distance");
  meta.inputs() = {{"dump", f.common.dump}};
  meta.params() =
      diagnostic_params(variants, sel, schema, f.reference, threads, f.common, device, own_names);
  meta.params().update({{"patch_size", patch_json},
                        {"renormalise", f.opt.renormalise},
                        {"prefix_tokens", "dropped as queries and keys"},
                        {"bins", f.bins}});
  // Layers of another geometry: their stage's patch, and what uniform rows give there.
  nlohmann::json stage_patch = nlohmann::json::object(), baselines = nlohmann::json::object();
  for (int l : sel.layers) {
    const LayerGeometry g = schema.geometry(l);
    if (!analyses::distance_by_units(geometry, g)) continue;
    const std::string key = std::to_string(schema.model_layer(l));
    const auto [ph, pw] = analyses::layer_patch(geometry, g);
    stage_patch[key] = {{"height", ph}, {"width", pw}};
    baselines[key] = analyses::uniform_distance_units(g, geometry, f.opt.renormalise);
  }
  if (!stage_patch.empty()) {
    meta.params()["layer_geometry"] = layer_geometry_json(schema, sel.layers);
    meta.params()["stage_patch_size"] = stage_patch;
    meta.params()["positions"] =
        "each token at its patch's centre in its stage's grid; windows: the cells of the window, "
        "the shifted-window mask's pairs weigh 0; reduced keys: the centre of the block of query "
        "cells each pools, row (kr + 1/2) H / Hk - 1/2, column (kc + 1/2) W / Wk - 1/2";
  }
  ImageRun run(f.control, "distance", command_args(args), dir, run_fingerprint("distance", f.common.dump, meta.params()),
               sel.images);
  ImageTimer timer;
  analyses::QueryStatsTotals totals(variants, sel, layout);
  totals.result().layer_variant_names = own_names;
  const auto measure = analyses::distance_measure(geometry, f.opt, schema.attrs.scale, f.reference);
  auto publish = [&](analyses::QueryStatsResult& r) {
    require_measured_rows(totals.measured(), "there is no distance to measure");
    for (auto& cells : r.cells) drop_missing_heads(cells, schema);
    for (auto& cells : r.cells) report_model_layers(cells, schema);
    ResultSet set(dir, "distance.json");
    write_distance_files(set, r);
    meta.results() = distance_results(r, geometry, f.opt.renormalise, sel.own_variants);
    if (!baselines.empty()) meta.results()["uniform_baseline_per_layer"] = baselines;
    meta.results()["ms_per_image"] = timer.summary();
    meta.publish(set);
  };
  if (!run_query_stats("distance", run, reader, sel, variants, layout, measure, timer, totals, publish)) return 0;
  print_summary(totals.result(), patch, f.opt.renormalise, analyses::uniform_distance(geometry, f.opt.renormalise));
  return 0;
}

const CommandRegistration kRegistration{
    {"distance", "mean attention distance in pixels per layer and head (ViT papers), and its histogram",
     run_distance_cmd, true}};

}  // namespace
}  // namespace attnscope::app
