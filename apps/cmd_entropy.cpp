// attnscope entropy: per layer and head, the entropy of every query's attention row in nats and as
// a share of log N, and its distribution.
#include "command.hpp"
#include "common.hpp"
#include "diagnostic_options.hpp"
#include "attnscope/run/image_run.hpp"
#include "query_stats_record.hpp"
#include "selection_flags.hpp"

#include "attnscope/analyses/entropy.hpp"

#include <iomanip>
#include <iostream>

namespace attnscope::app {
namespace {

constexpr const char* kNegativeRows =
    "rows with a negative weight: the entropy of |w_ij| / sum_m |w_im| (the row's magnitudes "
    "renormalised), counted in negative_weight_rows; other rows: the weights as given";

struct EntropyFlags {
  CommonOptions common;
  SelectionFlags sel;
  analyses::EntropyOptions opt;
  int bins = 32;
  bool reference = false;
  RunControl control;
};

po::options_description entropy_options(EntropyFlags& f) {
  po::options_description d("options");
  add_diagnostic_input_options(d, f.common, f.sel, "results/entropy");
  d.add_options()
      ("log-eps", po::value(&f.opt.log_eps)->value_name("E")->default_value(f.opt.log_eps, "0"),
       "entropy -sum w log(w + E): 0 is the exact entropy (0 log 0 = 0), 1e-6 the convention of "
       "code that adds it")
      ("bins", po::value(&f.bins)->value_name("B")->default_value(f.bins), "histogram bins over [0, log N]")
      ("reference", po::bool_switch(&f.reference), "plain double-precision loops (slow; for checks)");
  add_diagnostic_run_options(d, f.common, f.control);
  return d;
}

void print_summary(const analyses::QueryStatsResult& r, int tokens, double log_n, double eps) {
  std::cout << "attention entropy as a share of log N (" << r.images << " images; N = " << tokens
            << " keys, every query; log N = " << std::setprecision(5) << log_n
            << "; windows and reduced keys: log of the keys each query sees; -sum w log(w"
            << (eps > 0 ? " + eps" : "") << "))\n"
            << std::left << std::setw(28) << "variant"
            << "per layer, mean over heads\n";
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    std::cout << std::setw(28)
              << analyses::all_layers_variant_name(r.layer_variant_names, r.variants[v]);
    for (const auto& [layer, mean] : layer_means(r.cells[v], 2)) {
      std::cout << " " << std::fixed << std::setprecision(3) << mean;
    }
    std::cout << std::defaultfloat << "\n";
    std::int64_t n = 0;
    for (const auto& c : r.cells[v]) n += c.counters[1];
    if (n > 0) {
      std::cout << "  (" << n << " rows with negative weights: entropy of |w| renormalised)\n";
    }
  }
}

int run_entropy_cmd(const std::vector<std::string>& args) {
  EntropyFlags f;
  const po::options_description desc = entropy_options(f);
  po::variables_map vm;
  if (!parse_args("entropy", "--dump FILE [options]", desc, args, vm)) return 0;
  if (!(f.opt.log_eps >= 0.0)) {
    throw UsageError("--log-eps: expected a number >= 0, found " + std::to_string(f.opt.log_eps));
  }
  if (f.bins < 1 || f.bins > 1000000) {
    throw UsageError("--bins: expected 1 to 1000000 bins, found " + std::to_string(f.bins));
  }
  const int threads = apply_threads(f.common.threads);
  const ResolvedDevice device = apply_device("entropy", f.common, false);
  DumpReader reader(f.common.dump);
  const DumpSchema& schema = reader.schema();
  std::map<int, std::string> own_names;  // each layer's own variant's, on a hybrid dump
  analyses::Selection sel = with_own_variants(make_selection(f.sel, schema, f.common.seed),
                                              f.common, schema, own_names, "");
  sel.any_geometry = true;  // windows and reduced keys: each row over the keys it sees
  const std::vector<Variant> variants = resolve_variants(f.common, schema, sel.layers);
  const int tokens = schema.attrs.num_tokens;
  const double log_n = analyses::max_entropy(tokens);
  const analyses::QueryStatsLayout layout = analyses::entropy_layout(tokens, f.bins);
  const std::filesystem::path dir = ensure_out_dir(f.common.out);

  RunMetadata meta("entropy");
  meta.inputs() = {{"dump", f.common.dump}};
  meta.params() =
      diagnostic_params(variants, sel, schema, f.reference, threads, f.common, device, own_names);
  meta.params().update({{"log_eps", f.opt.log_eps},
                        {"queries", "every token, prefix tokens included"},
                        {"keys",
                         "every token the query sees: all of the layer's keys; in a "
                         "window, the window's tokens its mask allows; under spatial "
                         "reduction, the reduced grid's"},
                        {"normalised", "each row's entropy over log of the keys it sees"},
                        {"negative_weights", kNegativeRows},
                        {"bins", f.bins}});
  if (const nlohmann::json geo = layer_geometry_json(schema, sel.layers); !geo.is_null()) {
    meta.params()["layer_geometry"] = geo;
  }
  ImageRun run(f.control, "entropy", command_args(args), dir, run_fingerprint("entropy", f.common.dump, meta.params()),
               sel.images);
  ImageTimer timer;
  analyses::QueryStatsTotals totals(variants, sel, layout);
  totals.result().layer_variant_names = own_names;
  const auto measure = analyses::entropy_measure(f.opt, schema.attrs.scale, f.reference);
  auto publish = [&](analyses::QueryStatsResult& r) {
    require_measured_rows(totals.measured(), "there is no entropy to measure");
    for (auto& cells : r.cells) drop_missing_heads(cells, schema);
    for (auto& cells : r.cells) report_model_layers(cells, schema);
    ResultSet set(dir, "entropy.json");
    write_entropy_files(set, r);
    meta.results() = entropy_results(r, log_n);
    meta.results()["ms_per_image"] = timer.summary();
    meta.publish(set);
  };
  if (!run_query_stats("entropy", run, reader, sel, variants, layout, measure, timer, totals, publish)) return 0;
  print_summary(totals.result(), tokens, log_n, f.opt.log_eps);
  return 0;
}

const CommandRegistration kRegistration{
    {"entropy", "entropy of every query's attention row per layer and head, in nats and as a share of log N",
     run_entropy_cmd, true}};

}  // namespace
}  // namespace attnscope::app
