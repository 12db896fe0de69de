// attnscope confusion: counts confused query pairs per image, layer and head (InLine Fig. 2).
#include "command.hpp"
#include "common.hpp"
#include "attnscope/run/image_run.hpp"
#include "attnscope/run/result_files.hpp"
#include "selection_flags.hpp"

#include "attnscope/analyses/confusion.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace attnscope::app {
namespace {

struct ConfusionFlags {
  CommonOptions common;
  SelectionFlags sel;
  analyses::ConfusionOptions opt;
  bool reference = false;
  std::string exclude_tokens = "none";
  RunControl control;
};

po::options_description confusion_options(ConfusionFlags& f) {
  po::options_description d("options");
  add_dump_option(d, f.common);
  add_out_option(d, f.common, "results/confusion");
  add_variant_option(d, f.common, dumps_own_variant(true));
  add_selection_options(d, f.sel, true);
  d.add_options()
      ("eps", po::value(&f.opt.eps)->value_name("E")->default_value(f.opt.eps, "1e-3"),
       "L2 radius on attention rows")
      ("query-eps", po::value(&f.opt.query_eps)->value_name("E")->default_value(f.opt.query_eps, "1e-6"),
       "raw queries closer than this (L2) are the same query, never confusion")
      ("reference", po::bool_switch(&f.reference),
       "brute force over every pair in double (slow; for checks and benchmarks)")
      ("exclude-tokens", po::value(&f.exclude_tokens)->value_name("FILTER")->default_value(f.exclude_tokens),
       "leave tokens out of every pair: none, constant-patch (grid tokens whose patch of /images is "
       "constant) or mask:DATASET (a [images, tokens] bool/uint8 mask in the dump, 1 = exclude)");
  add_threads_option(d, f.common);
  add_device_option(d, f.common);
  add_seed_option(d, f.common);
  add_run_control_options(d, f.control);
  return d;
}

/// An image's record: "heads", per variant the four counts of every head slot in a row, and
/// "excluded_tokens", the image's tokens left out by the filter.
nlohmann::json to_record(const analyses::ConfusionImage& img) {
  nlohmann::json r = nlohmann::json::array();
  for (const auto& heads : img.heads) {
    std::vector<std::int64_t> flat;
    flat.reserve(4 * heads.size());
    for (const auto& h : heads) {
      flat.insert(flat.end(), {h.pairs, h.degenerate_rows, h.degenerate_pairs, h.candidates});
    }
    r.push_back(std::move(flat));
  }
  return {{"heads", std::move(r)}, {"excluded_tokens", img.excluded_tokens}};
}

analyses::ConfusionImage from_record(int image, const nlohmann::json& rec) {
  analyses::ConfusionImage img;
  img.image = image;
  if (!rec.is_object() || !rec.contains("heads") || !rec.contains("excluded_tokens")) {
    throw Error("confusion: a malformed record of image " + std::to_string(image));
  }
  img.excluded_tokens = rec.at("excluded_tokens").get<int>();
  for (const auto& v : rec.at("heads")) {
    const auto flat = v.get<std::vector<std::int64_t>>();
    if (flat.size() % 4 != 0) throw Error("confusion: a malformed record of image " + std::to_string(image));
    std::vector<analyses::HeadConfusion> heads(flat.size() / 4);
    for (std::size_t s = 0; s < heads.size(); ++s) {
      heads[s].pairs = flat[4 * s];
      heads[s].degenerate_rows = static_cast<int>(flat[4 * s + 1]);
      heads[s].degenerate_pairs = flat[4 * s + 2];
      heads[s].candidates = flat[4 * s + 3];
    }
    img.heads.push_back(std::move(heads));
  }
  return img;
}

using Histograms = std::vector<std::array<std::int64_t, analyses::kConfusionBins>>;

void print_histogram(const analyses::ConfusionResult& r, const Histograms& hist) {
  std::cout << std::left << std::setw(28) << "variant";
  for (const auto& label : analyses::confusion_bin_labels()) std::cout << std::setw(7) << label;
  std::cout << "\n";
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    std::cout << std::setw(28) << analyses::all_layers_variant_name(r.layer_variant_names, r.variants[v]);
    for (auto n : hist[v]) std::cout << std::setw(7) << n;
    std::cout << "\n";
  }
}

/// Rows: layers; columns: variants; cells: mean confused pairs per image (all images' total).
void print_per_layer(const analyses::ConfusionResult& r) {
  std::cout << "confused pairs per layer: mean per image (total over " << r.images << " images)\n";
  std::vector<int> width;
  std::cout << std::left << std::setw(7) << "layer";
  for (const Variant& v : r.variants) {
    const std::string name = analyses::all_layers_variant_name(r.layer_variant_names, v);
    width.push_back(std::max<int>(20, static_cast<int>(name.size()) + 2));
    std::cout << std::setw(width.back()) << name;
  }
  std::cout << "\n";
  const std::size_t layers = r.per_layer.empty() ? 0 : r.per_layer.front().size();
  for (std::size_t l = 0; l < layers; ++l) {
    std::cout << std::setw(7) << r.per_layer.front()[l].layer;
    for (std::size_t v = 0; v < r.variants.size(); ++v) {
      std::ostringstream cell;
      cell << std::fixed << std::setprecision(2) << mean_per_image(r.per_layer[v][l].count, r.images)
           << " (" << r.per_layer[v][l].count << ")";
      std::cout << std::setw(width[v]) << cell.str();
    }
    if (!r.layer_variant_names.empty()) {
      std::cout << analyses::row_variant_name(r.layer_variant_names, r.variants.front(),
                                              r.per_layer.front()[l].layer);
    }
    std::cout << "\n";
  }
}

void print_summary(const analyses::ConfusionResult& r, const analyses::TokenFilter& filter,
                   int tokens, const std::vector<std::int64_t>& degenerate_pairs) {
  std::cout << "images with a given number of confused pairs (" << r.images << " images)\n";
  print_histogram(r, r.histogram);
  std::cout << "the same with the degenerate pairs (two degenerate rows, raw queries apart: "
               "confused where code guards the denominator)\n";
  print_histogram(r, r.histogram_with_degenerate);
  std::cout << "degenerate pairs, all images:";
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    std::cout << (v ? ", " : " ")
              << analyses::all_layers_variant_name(r.layer_variant_names, r.variants[v]) << " "
              << degenerate_pairs[v];
  }
  std::cout << "\n";
  print_per_layer(r);
  if (!filter.active()) {
    std::cout << "tokens excluded: none (--exclude-tokens none)\n";
    return;
  }
  std::cout << "tokens excluded (--exclude-tokens " << filter.name() << "): " << std::fixed
            << std::setprecision(1) << mean_per_image(r.excluded_tokens, r.images) << " of " << tokens
            << " per image on average (min " << r.min_excluded_tokens << ", max "
            << r.max_excluded_tokens << "); pairs with an excluded token are not counted\n";
}

int run_confusion_cmd(const std::vector<std::string>& args) {
  ConfusionFlags f;
  const po::options_description desc = confusion_options(f);
  po::variables_map vm;
  if (!parse_args("confusion", "--dump FILE [options]", desc, args, vm)) return 0;
  analyses::check_confusion_options(f.opt, "--eps", "--query-eps");
  f.opt.exclude = analyses::parse_token_filter(f.exclude_tokens);
  const int threads = apply_threads(f.common.threads);
  const ResolvedDevice device =  // --reference is the CPU's plain double loops
      apply_device(f.reference ? "confusion --reference" : "confusion", f.common, !f.reference);
  f.opt.device = device.used;
  DumpReader reader(f.common.dump);
  const DumpSchema& schema = reader.schema();
  analyses::Selection sel = make_selection(f.sel, schema, f.common.seed);
  const std::vector<Variant> variants = resolve_variants(f.common, schema, sel.layers);
  sel.own_variants = layers_own_variants(f.common, schema, sel.layers);
  const std::map<int, std::string> own_names = own_variant_names(schema, sel.own_variants, sel.layers);
  analyses::check_token_filter(reader, f.opt.exclude);
  const std::filesystem::path dir = ensure_out_dir(f.common.out);

  RunMetadata meta("confusion");
  meta.inputs() = {{"dump", f.common.dump}};
  meta.params() = {{"variants", variants_json(variants, own_names)}, {"eps", f.opt.eps}, {"query_eps", f.opt.query_eps},
                   {"transform", sel.transform.name()}, {"images", sel.images.size()},
                   {"layers", model_layers_of(schema, sel.layers)}, {"heads", sel.heads}, {"reference", f.reference},
                   {"exclude_tokens", f.opt.exclude.name()}, {"threads", threads}, {"seed", f.common.seed}};
  meta.params()["device"] = device.description;
  if (const nlohmann::json geo = layer_geometry_json(schema, sel.layers); !geo.is_null()) {
    meta.params()["layer_geometry"] = geo;
  }
  ImageRun run(f.control, "confusion", command_args(args), dir,
               run_fingerprint("confusion", f.common.dump, meta.params()), sel.images);
  ImageTimer timer;
  run.compute([&] {
    analyses::Selection part = sel;
    part.images = run.pending();
    Progress progress("confusion", part.images.size());
    analyses::confusion_images(reader, part, variants, f.opt, f.reference,
                               [&](analyses::ConfusionImage&& img) {
                                 run.record(img.image, to_record(img));
                                 timer.tick();
                                 progress.tick();
                               });
    progress.finish();
  });

  const int tokens = schema.attrs.num_tokens;
  analyses::ConfusionTotals totals(variants, sel, tokens);
  const std::vector<int> model_layers = model_layers_of(schema, sel.layers);
  std::vector<std::int64_t> degenerate_pairs(variants.size(), 0);
  std::unique_ptr<ResultSet> set;
  std::unique_ptr<ConfusionFiles> files;
  auto open_set = [&] {
    if (set) return;
    set = std::make_unique<ResultSet>(dir, "confusion.json");
    files = std::make_unique<ConfusionFiles>(*set, variants, model_layers, f.opt.exclude.active());
    files->set_layer_variant_names(own_names);
  };
  auto apply = [&](int image, const nlohmann::json& rec) {
    open_set();
    const analyses::ConfusionImage img = from_record(image, rec);
    files->add_image(img, totals.add(img));
  };
  auto publish = [&] {
    analyses::ConfusionResult& r = totals.result();
    r.layer_variant_names = own_names;
    for (auto& heads : r.per_head) drop_missing_heads(heads, schema);
    for (auto& heads : r.per_head) report_model_layers(heads, schema);
    for (auto& layers : r.per_layer) report_model_layers(layers, schema);
    std::int64_t degenerate = 0, slots = 0;
    for (const auto& heads : r.per_head) {
      slots += static_cast<std::int64_t>(heads.size());
      for (const auto& h : heads) degenerate += h.degenerate_rows;
    }
    require_measured_rows(r.images * slots * schema.attrs.num_tokens - degenerate,
                          "no pair can be compared");
    if (r.images > 0 && r.images_with_two_tokens_left == 0) {
      throw NothingToMeasure(
          "--exclude-tokens " + f.opt.exclude.name() +
          " leaves fewer than two tokens in every image of the selection, so no pair "
          "can be compared");
    }
    open_set();
    files->finish(r);
    nlohmann::json hist = nlohmann::json::object(), hist_degenerate = nlohmann::json::object();
    nlohmann::json pairs_degenerate = nlohmann::json::object(), per_layer = nlohmann::json::object();
    for (std::size_t v = 0; v < variants.size(); ++v) {
      for (const auto& h : r.per_head[v]) degenerate_pairs[v] += h.degenerate_pairs;
      const std::string name = analyses::all_layers_variant_name(own_names, variants[v]);
      hist[name] = r.histogram[v];
      hist_degenerate[name] = r.histogram_with_degenerate[v];
      pairs_degenerate[name] = degenerate_pairs[v];
      nlohmann::json layers = nlohmann::json::array();
      for (const auto& l : r.per_layer[v]) {
        layers.push_back({{"layer", l.layer},
                          {"variant", analyses::row_variant_name(own_names, variants[v], l.layer)},
                          {"count", l.count},
                          {"mean_per_image", mean_per_image(l.count, r.images)},
                          {"images_with_pairs", l.images_with_pairs},
                          {"degenerate_pairs", l.degenerate_pairs}});
      }
      per_layer[name] = std::move(layers);
    }
    const nlohmann::json excluded_tokens = {
        {"filter", f.opt.exclude.name()},
        {"total", r.excluded_tokens},
        {"mean_per_image", mean_per_image(r.excluded_tokens, r.images)},
        {"min_per_image", r.min_excluded_tokens},
        {"max_per_image", r.max_excluded_tokens},
        {"tokens_per_image", tokens}};
    meta.results() = {{"images", r.images},
                      {"histogram", hist},
                      {"histogram_with_degenerate_pairs", hist_degenerate},
                      {"degenerate_pairs", pairs_degenerate},
                      {"per_layer", per_layer},
                      {"excluded_tokens", excluded_tokens},
                      {"candidates", r.candidates},
                      {"ms_per_image", timer.summary()}};
    meta.publish(*set);
  };
  if (!run.finish(apply, publish)) return 0;
  const analyses::ConfusionResult& r = totals.result();
  print_summary(r, f.opt.exclude, tokens, degenerate_pairs);
  return 0;
}

const CommandRegistration kRegistration{
    {"confusion", "count confused query pairs (rows within --eps) per image, layer and head",
     run_confusion_cmd, true}};

}  // namespace
}  // namespace attnscope::app
