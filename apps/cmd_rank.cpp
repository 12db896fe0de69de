// attnscope rank: numerical and effective rank of every head's attention matrix and (kernel
// families) key-value state, the conditioning of K, [K, 1], F_k, [F_k, 1] (InLine Prop. 1 and 3),
// and the rank-collapse residual of the model's own output, averaged over images.
#include "command.hpp"
#include "common.hpp"
#include "diagnostic_options.hpp"
#include "attnscope/run/image_run.hpp"
#include "query_stats_record.hpp"
#include "selection_flags.hpp"

#include "attnscope/analyses/rank.hpp"

#include <iomanip>
#include <iostream>

namespace attnscope::app {
namespace {

struct RankFlags {
  CommonOptions common;
  SelectionFlags sel;
  analyses::RankOptions opt;
  bool reference = false;
  RunControl control;
};

po::options_description rank_options(RankFlags& f) {
  po::options_description d("options");
  add_diagnostic_input_options(d, f.common, f.sel, "results/rank");
  d.add_options()
      ("rank-tol", po::value(&f.opt.rank_tol)->value_name("R")->default_value(f.opt.rank_tol, "0"),
       "numerical rank: singular values above R x the largest (0: numpy's rule, the largest x "
       "max(m, n) x 2^-52)")
      ("reference", po::bool_switch(&f.reference), "plain double-precision loops and Jacobi SVD (slow; for checks)");
  add_diagnostic_run_options(d, f.common, f.control);
  return d;
}

void print_summary(const analyses::QueryStatsResult& r, int tokens) {
  std::cout << "rank of the attention matrix (" << r.images << " images; N = " << tokens
            << "): numerical / effective, per layer, mean over heads\n";
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    std::cout << std::left << std::setw(28)
              << analyses::all_layers_variant_name(r.layer_variant_names, r.variants[v]);
    const auto erank = layer_means(r.cells[v], 1);
    for (const auto& [layer, mean] : layer_means(r.cells[v], 0)) {
      std::cout << " " << std::fixed << std::setprecision(1) << mean << "/" << erank.at(layer);
    }
    std::cout << std::defaultfloat << "\n";
  }
  const auto residual = layer_means(r.cells.front(), 8);
  if (!residual.empty()) {
    std::cout << "rank-collapse residual of the model's out, per layer:";
    for (const auto& [layer, mean] : residual) std::cout << " " << std::fixed << std::setprecision(3) << mean;
    std::cout << std::defaultfloat << "\n";
  }
}

int run_rank_cmd(const std::vector<std::string>& args) {
  RankFlags f;
  const po::options_description desc = rank_options(f);
  po::variables_map vm;
  if (!parse_args("rank", "--dump FILE [options]", desc, args, vm)) return 0;
  if (!(f.opt.rank_tol >= 0.0)) {
    throw UsageError("--rank-tol: expected a number >= 0, found " + std::to_string(f.opt.rank_tol));
  }
  const int threads = apply_threads(f.common.threads);
  const ResolvedDevice device = apply_device("rank", f.common, false);
  DumpReader reader(f.common.dump);
  const DumpSchema& schema = reader.schema();
  std::map<int, std::string> own_names;  // each layer's own variant's, on a hybrid dump
  analyses::Selection sel = with_own_variants(make_selection(f.sel, schema, f.common.seed),
                                              f.common, schema, own_names, "");
  sel.any_geometry = true;  // one matrix per window, N x M under spatial reduction
  const std::vector<Variant> variants = resolve_variants(f.common, schema, sel.layers);
  const int tokens = schema.attrs.num_tokens;
  const analyses::QueryStatsLayout layout = analyses::rank_layout(tokens);
  const std::filesystem::path dir = ensure_out_dir(f.common.out);

  nlohmann::json out_layers = nlohmann::json::array();
  for (int l : sel.layers) {
    if (schema.layer_has_out[static_cast<std::size_t>(l)]) out_layers.push_back(schema.model_layer(l));
  }
  RunMetadata meta("rank");
  meta.inputs() = {{"dump", f.common.dump}};
  meta.params() =
      diagnostic_params(variants, sel, schema, f.reference, threads, f.common, device, own_names);
  meta.params().update({{"rank_tol", f.opt.rank_tol},
                        {"rank_rule", f.opt.rank_tol > 0 ? "singular values above rank_tol x the largest"
                                                         : "singular values above the largest x max(m, n) x 2^-52 (numpy)"},
                        {"out_layers", out_layers}});
  if (const nlohmann::json geo = layer_geometry_json(schema, sel.layers); !geo.is_null()) {
    meta.params()["layer_geometry"] = geo;
    meta.params()["units"] =
        "windows: one value per window and image (each window's N_w x N_w matrix, its mask "
        "applied; a masked window has no key-value state), full-rank counts per window; reduced "
        "keys: the N x M matrix; out_residual: the layer's whole output";
  }
  ImageRun run(f.control, "rank", command_args(args), dir, run_fingerprint("rank", f.common.dump, meta.params()), sel.images);
  ImageTimer timer;
  analyses::QueryStatsTotals totals(variants, sel, layout);
  totals.result().layer_variant_names = own_names;
  const auto measure = analyses::rank_measure(f.opt, schema.attrs.scale, f.reference);
  auto publish = [&](analyses::QueryStatsResult& r) {
    require_measured_rows(rank_measured_rows(r, tokens), "there is no matrix to measure");
    for (auto& cells : r.cells) drop_missing_heads(cells, schema);
    for (auto& cells : r.cells) report_model_layers(cells, schema);
    ResultSet set(dir, "rank.json");
    write_rank_files(set, r);
    meta.results() = rank_results(r);
    meta.results()["ms_per_image"] = timer.summary();
    meta.publish(set);
  };
  if (!run_query_stats("rank", run, reader, sel, variants, layout, measure, timer, totals, publish, true, true)) {
    return 0;
  }
  print_summary(totals.result(), tokens);
  return 0;
}

const CommandRegistration kRegistration{
    {"rank", "numerical and effective rank of W and of the key-value state, conditioning of K and [K, 1], "
             "rank collapse of out",
     run_rank_cmd, true}};

}  // namespace
}  // namespace attnscope::app
