// attnscope census: per layer and head, how many InLine / MALA weights are negative or zero, the
// smallest weight, and how many rows fail to sum to 1.
#include "command.hpp"
#include "common.hpp"
#include "attnscope/run/image_run.hpp"
#include "attnscope/run/result_files.hpp"
#include "selection_flags.hpp"

#include "attnscope/analyses/census.hpp"

#include <cmath>
#include <iomanip>
#include <iostream>
#include <sstream>

namespace attnscope::app {
namespace {

struct CensusFlags {
  CommonOptions common;
  SelectionFlags sel;
  double sum_tol = analyses::kDefaultSumTolerance;
  RunControl control;
};

po::options_description census_options(CensusFlags& f) {
  po::options_description d("options");
  add_dump_option(d, f.common);
  add_out_option(d, f.common, "results/census");
  add_variant_option(d, f.common,
                     {"inline and mala under the dump's convention, the dump's own map where its "
                      "model is one of them",
                      [](const DumpSchema& schema, std::uint64_t, const std::vector<int>&) {
                        return analyses::default_census_variants(schema.attrs);
                      }});
  add_selection_options(d, f.sel, false);
  d.add_options()("sum-tol",
                  po::value(&f.sum_tol)->value_name("T")->default_value(f.sum_tol, "1e-6"),
                  "a row fails to sum to 1 when |sum - 1| > T");
  add_threads_option(d, f.common);
  add_device_option(d, f.common);
  add_run_control_options(d, f.control);
  return d;
}

/// An image's record: its census cells (in the collector's order), one array per field.
nlohmann::json to_record(const std::vector<analyses::CensusCell>& cells) {
  const analyses::CensusColumns c = analyses::census_columns(cells);
  return {{"rows", c.rows},
          {"weights", c.weights},
          {"negative", c.negative},
          {"zero", c.zero},
          {"most_negative", c.most_negative},
          {"rows_not_summing_to_one", c.rows_not_summing_to_one},
          {"max_row_sum_error", c.max_row_sum_error},
          {"degenerate_rows", c.degenerate_rows}};
}

std::vector<analyses::CensusCell> from_record(int image, const nlohmann::json& r) {
  const auto rows = r.at("rows").get<std::vector<long long>>();
  const auto weights = r.at("weights").get<std::vector<long long>>();
  const auto negative = r.at("negative").get<std::vector<long long>>();
  const auto zero = r.at("zero").get<std::vector<long long>>();
  const auto most_negative = r.at("most_negative").get<std::vector<double>>();
  const auto not_summing = r.at("rows_not_summing_to_one").get<std::vector<long long>>();
  const auto max_error = r.at("max_row_sum_error").get<std::vector<double>>();
  const auto degenerate = r.at("degenerate_rows").get<std::vector<long long>>();
  const std::size_t n = rows.size();
  for (std::size_t size : {weights.size(), negative.size(), zero.size(), most_negative.size(),
                           not_summing.size(), max_error.size(), degenerate.size()}) {
    if (size != n) throw Error("census: a malformed record of image " + std::to_string(image));
  }
  std::vector<analyses::CensusCell> cells(n);
  for (std::size_t i = 0; i < n; ++i) {
    cells[i].rows = rows[i];
    cells[i].weights = weights[i];
    cells[i].negative = negative[i];
    cells[i].zero = zero[i];
    cells[i].most_negative = most_negative[i];
    cells[i].rows_not_summing_to_one = not_summing[i];
    cells[i].max_row_sum_error = max_error[i];
    cells[i].degenerate_rows = degenerate[i];
  }
  return cells;
}

void print_summary(const std::vector<analyses::CensusCell>& ts, std::size_t images) {
  std::cout << "weight census over " << images << " images\n"
            << std::left << std::setw(26) << "variant" << std::setw(14) << "weights"
            << std::setw(24) << "negative" << std::setw(10) << "zero" << std::setw(15)
            << "most_negative"
            << "rows_not_summing_to_one\n";
  for (const auto& t : ts) {
    const double share =
        t.weights ? 100.0 * static_cast<double>(t.negative) / static_cast<double>(t.weights) : 0.0;
    std::ostringstream neg;
    neg << t.negative << " (" << std::setprecision(3) << share << "%)";
    std::cout << std::setw(26) << t.variant << std::setw(14) << t.weights << std::setw(24)
              << neg.str() << std::setw(10) << t.zero << std::setw(15) << std::setprecision(6)
              << t.most_negative << t.rows_not_summing_to_one << " of " << t.rows;
    if (t.degenerate_rows) std::cout << " (" << t.degenerate_rows << " degenerate rows left out)";
    std::cout << "\n";
  }
}

int run_census_cmd(const std::vector<std::string>& args) {
  CensusFlags f;
  const po::options_description desc = census_options(f);
  po::variables_map vm;
  if (!parse_args("census", "--dump FILE [options]", desc, args, vm)) return 0;
  const int threads = apply_threads(f.common.threads);
  const ResolvedDevice device = apply_device("census", f.common, true);
  DumpReader reader(f.common.dump);
  const DumpSchema& schema = reader.schema();
  analyses::Selection sel = make_selection(f.sel, schema, 0);
  sel.any_geometry = true;  // each window's weights (its mask's pairs), or N x M reduced keys
  sel.need_v = false;  // the census looks at attention weights only
  const std::vector<Variant> variants = resolve_variants(f.common, schema, sel.layers);
  analyses::CensusCollector collector(variants, sel, schema.attrs.scale, f.sum_tol);
  const std::filesystem::path dir = ensure_out_dir(f.common.out);

  RunMetadata meta("census");
  meta.inputs() = {{"dump", f.common.dump}};
  meta.params() = {{"variants", variant_names(variants)},
                   {"sum_tol", f.sum_tol},
                   {"images", sel.images.size()},
                   {"layers", model_layers_of(schema, sel.layers)},
                   {"heads", sel.heads},
                   {"precision", "double"},
                   {"threads", threads}};
  meta.params()["device"] = device.description;
  if (const nlohmann::json geo = layer_geometry_json(schema, sel.layers); !geo.is_null()) {
    meta.params()["layer_geometry"] = geo;
    meta.params()["units"] =
        "windows: each window's weights, only the pairs its mask allows counted as weights; "
        "reduced keys: the N x M weights; counted on the CPU";
  }
  ImageRun run(f.control, "census", command_args(args), dir,
               run_fingerprint("census", f.common.dump, meta.params()), sel.images);
  run.compute([&] {
    analyses::Selection part = sel;
    part.images = run.pending();
    Progress progress("census", part.images.size());
    analyses::census_images(reader, part, variants, schema.attrs.scale, f.sum_tol,
                            [&](int image, std::vector<analyses::CensusCell>&& cells) {
                              run.record(image, to_record(cells));
                              progress.tick();
                            },
                            device.used);
    progress.finish();
  });

  auto apply = [&](int image, const nlohmann::json& rec) { collector.add(from_record(image, rec)); };
  std::vector<analyses::CensusCell> ts;
  auto publish = [&] {
    auto cells = collector.cells();
    long long rows = 0;
    for (const auto& c : cells) rows += c.rows;
    require_measured_rows(rows, "there are no weights to count");
    drop_missing_heads(cells, schema);  // a layer with fewer heads than another
    report_model_layers(cells, schema);
    ResultSet set(dir, "census.json");
    ts = write_census_files(set, variants, cells);
    meta.results() = {{"totals", census_totals_json(ts)}};
    meta.publish(set);
  };
  if (!run.finish(apply, publish)) return 0;
  print_summary(ts, sel.images.size());
  return 0;
}

const CommandRegistration kRegistration{
    {"census", "count negative and zero InLine/MALA weights and rows not summing to 1, per head",
     run_census_cmd, true}};

}  // namespace
}  // namespace attnscope::app
