// attnscope recompute: recomputes each head's attention output (and weights) from the dump's
// q, k, v with the model's own variant and compares them with the tensors the model produced.
#include "command.hpp"
#include "common.hpp"
#include "attnscope/run/image_run.hpp"
#include "selection_flags.hpp"

#include "attnscope/analyses/recompute.hpp"

#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>

namespace attnscope::app {
namespace {

struct RecomputeFlags {
  CommonOptions common;
  SelectionFlags sel;
  double tol = -1.0;  // < 0: chosen by the dump's dtype
  RunControl control;
};

// Default tolerance on the relative output error: float16 storage of q, k, v and out alone
// accounts for errors of a few 1e-4 of the head's largest output; float32 for ~1e-6.
double default_tolerance(DType dtype) { return dtype == DType::F16 ? 5e-3 : 1e-4; }

/// An image's record: per (layer, head) cell, its eight fields in a row.
nlohmann::json to_record(const analyses::RecomputeImage& img) {
  nlohmann::json r = nlohmann::json::array();
  for (const auto& c : img.cells) {
    r.push_back({c.has_out, c.has_attn, c.out_max_abs, c.out_max_rel, c.out_sum_abs, c.out_values,
                 c.attn_max_abs, c.degenerate_rows});
  }
  return r;
}

/// Merges an image's record into `cells` (recompute_cells' order).
void merge_record(int image, const nlohmann::json& r, std::vector<analyses::RecomputeCell>& cells) {
  if (!r.is_array() || r.size() != cells.size()) {
    throw Error("recompute: a malformed record of image " + std::to_string(image));
  }
  for (std::size_t i = 0; i < cells.size(); ++i) {
    const nlohmann::json& f = r[i];
    analyses::RecomputeCell c;
    c.images = 1;
    c.has_out = f.at(0).get<bool>();
    c.has_attn = f.at(1).get<bool>();
    c.out_max_abs = f.at(2).get<double>();
    c.out_max_rel = f.at(3).get<double>();
    c.out_sum_abs = f.at(4).get<double>();
    c.out_values = f.at(5).get<long long>();
    c.attn_max_abs = f.at(6).get<double>();
    c.degenerate_rows = f.at(7).get<long long>();
    cells[i].merge(c);
  }
}

/// `variant_of_layer`: each row's variant by its (model) layer index.
void write_csv(ResultSet& set, const std::map<int, std::string>& variant_of_layer,
               const std::vector<analyses::RecomputeCell>& cells) {
  ResultFile f(set, "recompute.csv");
  f.stream() << "variant,layer,head,images,out_max_abs_error,out_max_rel_error,"
                "out_mean_abs_error,attn_max_abs_error,degenerate_rows\n"
             << std::setprecision(9);
  for (const auto& c : cells) {
    f.stream() << variant_of_layer.at(c.layer) << "," << c.layer << "," << c.head << "," << c.images
               << ",";
    if (c.has_out) f.stream() << c.out_max_abs << "," << c.out_max_rel << "," << c.out_mean_abs();
    else f.stream() << ",,";
    f.stream() << ",";
    if (c.has_attn) f.stream() << c.attn_max_abs;
    f.stream() << "," << c.degenerate_rows << "\n";
  }
  f.close();
}

int run_recompute(const std::vector<std::string>& args) {
  RecomputeFlags f;
  po::options_description d("options");
  add_dump_option(d, f.common);
  add_out_option(d, f.common, "results/recompute");
  add_images_option(d, f.sel.images);
  add_variant_option(d, f.common, dumps_own_variant(true));
  add_max_memory_option(d, f.sel);
  d.add_options()(
      "tol", po::value(&f.tol)->value_name("T"),
      "largest allowed output error relative to the head's largest |out| (default: 5e-3 for "
      "float16 dumps, 1e-4 for float32); also the largest absolute error allowed on weights");
  add_threads_option(d, f.common);
  add_device_option(d, f.common);
  add_run_control_options(d, f.control);
  po::variables_map vm;
  if (!parse_args("recompute", "--dump FILE [options]", d, args, vm)) return 0;
  if (vm.count("tol") != 0 && !(f.tol >= 0.0)) {  // given: never replaced by the default silently
    std::ostringstream found;
    found << f.tol;
    throw UsageError("--tol: expected a tolerance >= 0, found " + found.str());
  }
  const int threads = apply_threads(f.common.threads);
  const ResolvedDevice device = apply_device("recompute", f.common, false);

  DumpReader reader(f.common.dump);
  const DumpSchema& schema = reader.schema();
  // Without --variant each layer is recomputed with its own (a dump whose layers differ in family
  // records each layer's on its /layers/L group).
  const Variant variant = f.common.variant.empty() ? schema.layer_variant(0, f.common.seed)
                                                   : resolve_variants(f.common, schema).front();
  std::vector<Variant> per_layer;
  std::vector<std::string> names;
  std::map<int, std::string> by_model_layer;  // the CSV's rows carry model layer indices
  for (int l = 0; l < schema.attrs.num_layers; ++l) {
    per_layer.push_back(f.common.variant.empty() ? schema.layer_variant(l, f.common.seed)
                                                 : variant);
    std::string why;
    if (!per_layer.back().supports(&why)) {
      throw UsageError("layer " + std::to_string(schema.model_layer(l)) + ": " +
                       per_layer.back().name() + ": " + why);
    }
    names.push_back(per_layer.back().name());
    by_model_layer[schema.model_layer(l)] = names.back();
  }
  std::string described;  // "inline:identity@code" or "inline:identity@code, softmax@code"
  for (const std::string& n : names) {
    if (described.find(n) == std::string::npos) described += (described.empty() ? "" : ", ") + n;
  }
  const analyses::Selection sel = make_selection(f.sel, schema, f.common.seed);
  const double tol = f.tol >= 0.0 ? f.tol : default_tolerance(schema.dtype);
  const std::filesystem::path dir = ensure_out_dir(f.common.out);

  RunMetadata meta("recompute");
  meta.inputs() = {{"dump", f.common.dump}};
  meta.params() = {
      {"variant", described}, {"tol", tol}, {"threads", threads}, {"images", sel.images.size()}};
  meta.params()["device"] = device.description;
  ImageRun run(f.control, "recompute", command_args(args), dir,
               run_fingerprint("recompute", f.common.dump, meta.params()),
               sel.images);
  run.compute([&] {
    Progress progress("recompute", run.pending().size());
    analyses::recompute_images(
        reader, per_layer, run.pending(),
        [&](analyses::RecomputeImage&& img) {
          run.record(img.image, to_record(img));
          progress.tick();
        },
        sel);
    progress.finish();
  });

  std::vector<analyses::RecomputeCell> cells = analyses::recompute_cells(schema);
  auto apply = [&](int image, const nlohmann::json& rec) { merge_record(image, rec, cells); };
  double worst_rel = 0.0, worst_attn = 0.0;
  bool has_out = false, has_attn = false, pass = false;
  auto publish = [&] {
    ResultSet set(dir, "recompute.json");
    report_model_layers(cells, schema);
    write_csv(set, by_model_layer, cells);
    for (const auto& c : cells) {
      has_out = has_out || c.has_out;
      has_attn = has_attn || c.has_attn;
      worst_rel = std::max(worst_rel, c.out_max_rel);
      worst_attn = std::max(worst_attn, c.attn_max_abs);
    }
    pass = worst_rel <= tol && worst_attn <= tol;
    meta.results() = {{"worst_out_rel_error", worst_rel},
                      {"worst_attn_abs_error", worst_attn},
                      {"pass", pass}};
    meta.publish(set);
  };
  if (!run.finish(apply, publish)) return 0;
  std::cout << "recomputed "
            << (names.size() > 1 && described != names.front() ? "each layer's own: " : "")
            << described << " over " << sel.images.size() << " images, " << cells.size()
            << " heads\n";
  if (has_out) {
    std::cout << "  outputs: worst error " << worst_rel << " of the head's largest |out| (tol "
              << tol << ") " << (pass ? "PASS" : "FAIL") << "\n";
  }
  if (has_attn) {
    std::cout << "  weights: worst absolute error " << worst_attn << " (tol " << tol << ") "
              << (worst_attn <= tol ? "PASS" : "FAIL") << "\n";
  }
  std::cout << "  per head: " << (dir / "recompute.csv").string() << "\n";
  return pass ? 0 : kExitCheckFailed;
}

const CommandRegistration kRegistration{
    {"recompute", "recompute outputs from q/k/v and compare with the model's own (out, attn)",
     run_recompute, true}};

}  // namespace
}  // namespace attnscope::app
