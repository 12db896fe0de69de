// attnscope locality: attention mass in each query's k x k grid window (InLine Fig. 3).
#include "command.hpp"
#include "common.hpp"
#include "attnscope/run/image_run.hpp"
#include "attnscope/run/result_files.hpp"
#include "selection_flags.hpp"
#include "stats_record.hpp"

#include "attnscope/analyses/geometry_heads.hpp"
#include "attnscope/analyses/local_fold.hpp"
#include "attnscope/analyses/local_share.hpp"
#include "attnscope/analyses/locality.hpp"

#include <iomanip>
#include <iostream>

namespace attnscope::app {
namespace {

struct LocalityFlags {
  CommonOptions common;
  SelectionFlags sel;
  int window = 3;
  bool reference = false;
  bool fold_local = false;
  RunControl control;
};

po::options_description locality_options(LocalityFlags& f) {
  po::options_description d("options");
  add_dump_option(d, f.common);
  add_out_option(d, f.common, "results/locality");
  add_variant_option(d, f.common, dumps_own_variant(true));
  add_selection_options(d, f.sel, true);
  d.add_options()
      ("window", po::value(&f.window)->value_name("K")->default_value(f.window),
       "odd window size: the k x k grid cells around each query, itself included")
      ("reference", po::bool_switch(&f.reference), "plain double-precision loops (slow; for checks)")
      ("fold-local", po::bool_switch(&f.fold_local),
       "also the mass of the map with the local term's depthwise kernel folded in (W plus the "
       "convolution's token-to-token matrix of the head's mean kernel): locality_folded.csv");
  add_threads_option(d, f.common);
  add_device_option(d, f.common);
  add_seed_option(d, f.common);
  add_run_control_options(d, f.control);
  return d;
}

/// An image's record: per variant, the statistics of every head slot over the image's grid
/// queries, one array per field (queries, mean, m2, min, max, degenerate rows).
nlohmann::json to_record(const analyses::LocalityImage& img) {
  nlohmann::json r = nlohmann::json::array();
  for (const auto& heads : img.heads) {
    StatsColumns mass;
    std::vector<std::int64_t> degenerate;
    for (const auto& h : heads) {
      mass.push(h.mass);
      degenerate.push_back(h.degenerate_rows);
    }
    nlohmann::json v = {{"degenerate_rows", degenerate}};
    mass.write(v, "");
    r.push_back(std::move(v));
  }
  return r;
}

analyses::LocalityImage from_record(int image, const nlohmann::json& r) {
  analyses::LocalityImage img;
  img.image = image;
  const std::string what = "locality: image " + std::to_string(image);
  for (const auto& v : r) {
    const auto degenerate = v.at("degenerate_rows").get<std::vector<std::int64_t>>();
    const StatsColumns mass = StatsColumns::read(v, "", degenerate.size(), what);
    std::vector<analyses::LocalityHead> heads(degenerate.size());
    for (std::size_t s = 0; s < heads.size(); ++s) {
      heads[s].mass = mass.at(s);
      heads[s].degenerate_rows = degenerate[s];
    }
    img.heads.push_back(std::move(heads));
  }
  return img;
}

/// local_share.csv: the local term's share per (layer, head), for dumps holding local terms.
void write_local_share(ResultSet& set, const std::vector<analyses::LocalShareHead>& rows) {
  ResultFile f(set, "local_share.csv");
  f.stream() << "layer,head,images,mean,std,min,max\n" << std::setprecision(10);
  for (const auto& h : rows) {
    f.stream() << h.layer << "," << h.head << "," << h.share.count << ","
               << (h.share.count ? h.share.mean : 0.0) << "," << h.share.stddev() << ","
               << (h.share.count ? h.share.min : 0.0) << "," << (h.share.count ? h.share.max : 0.0)
               << "\n";
  }
  f.close();
}

/// Per layer, the mean over heads of each variant's mean local mass.
void print_summary(const analyses::LocalityResult& r) {
  std::cout << "mean attention mass in the " << r.window << "x" << r.window << " window (" << r.images
            << " images; uniform rows: " << std::setprecision(4) << r.uniform_baseline << ")\n"
            << std::left << std::setw(28) << "variant" << "per layer, mean over heads\n";
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    std::cout << std::setw(28) << analyses::all_layers_variant_name(r.layer_variant_names, r.variants[v]);
    std::map<int, analyses::RunningStats> layers;
    for (const auto& h : r.per_head[v]) {
      if (h.mass.count > 0) layers[h.layer].add(h.mass.mean);
    }
    for (const auto& [layer, s] : layers) std::cout << " " << std::fixed << std::setprecision(3) << s.mean;
    std::cout << std::defaultfloat << "\n";
  }
}

int run_locality_cmd(const std::vector<std::string>& args) {
  LocalityFlags f;
  const po::options_description desc = locality_options(f);
  po::variables_map vm;
  if (!parse_args("locality", "--dump FILE [options]", desc, args, vm)) return 0;
  if (f.window < 1 || f.window % 2 == 0) {
    throw UsageError("--window must be a positive odd number, found " + std::to_string(f.window));
  }
  const int threads = apply_threads(f.common.threads);
  const ResolvedDevice device =  // --reference is the CPU's plain double loops
      apply_device(f.reference ? "locality --reference" : "locality", f.common, !f.reference);
  DumpReader reader(f.common.dump);
  const DumpSchema& schema = reader.schema();
  analyses::Selection sel = make_selection(f.sel, schema, f.common.seed);
  const std::vector<Variant> variants = resolve_variants(f.common, schema, sel.layers);
  sel.own_variants = layers_own_variants(f.common, schema, sel.layers);
  const std::map<int, std::string> own_names = own_variant_names(schema, sel.own_variants, sel.layers);
  if (f.fold_local) analyses::require_local_kernels(schema, sel.layers);
  const std::filesystem::path dir = ensure_out_dir(f.common.out);

  RunMetadata meta("locality");
  meta.inputs() = {{"dump", f.common.dump}};
  meta.params() = {{"variants", variants_json(variants, own_names)}, {"window", f.window},
                   {"transform", sel.transform.name()}, {"images", sel.images.size()},
                   {"layers", model_layers_of(schema, sel.layers)}, {"heads", sel.heads}, {"reference", f.reference},
                   {"threads", threads}, {"seed", f.common.seed}};
  meta.params()["device"] = device.description;
  if (f.fold_local) meta.params()["fold_local"] = true;
  if (const nlohmann::json geo = layer_geometry_json(schema, sel.layers); !geo.is_null()) {
    meta.params()["layer_geometry"] = geo;
  }
  ImageRun run(f.control, "locality", command_args(args), dir,
               run_fingerprint("locality", f.common.dump, meta.params()), sel.images);
  ImageTimer timer;
  run.compute([&] {
    analyses::Selection part = sel;
    part.images = run.pending();
    Progress progress("locality", part.images.size());
    analyses::locality_images(reader, part, variants, f.window, f.reference,
                              [&](analyses::LocalityImage&& img) {
                                run.record(img.image, to_record(img));
                                timer.tick();
                                progress.tick();
                              },
                              device.used);
    progress.finish();
  });

  analyses::LocalityTotals totals(variants, sel, schema.attrs.grid, f.window);
  auto apply = [&](int image, const nlohmann::json& rec) { totals.add(from_record(image, rec)); };
  auto publish = [&] {
    analyses::LocalityResult& r = totals.result();
    std::int64_t measured = 0;
    for (const auto& heads : r.per_head) {
      for (const auto& h : heads) measured += h.mass.count;
    }
    require_measured_rows(measured, "there is no mass to measure");
    r.layer_variant_names = own_names;
    const std::vector<char> by_units = analyses::layers_by_units(schema, sel.layers);
    nlohmann::json baselines = nlohmann::json::object();
    for (int l : sel.layers) {
      if (!by_units[static_cast<std::size_t>(l)]) continue;
      const LayerGeometry g = schema.geometry(l);
      double b = analyses::uniform_baseline_units(g, f.window);
      if (g.second != nullptr) {  // CSwin's stripes: the two shapes' baselines, by their heads
        const double first = g.second_heads_from, rest = g.num_heads - g.second_heads_from;
        b = (b * first + analyses::uniform_baseline_units(*g.second, f.window) * rest) /
            (first + rest);
      }
      r.layer_baselines[schema.model_layer(l)] = b;
      baselines[std::to_string(schema.model_layer(l))] = r.layer_baselines[schema.model_layer(l)];
    }
    for (auto& heads : r.per_head) drop_missing_heads(heads, schema);
    for (auto& heads : r.per_head) report_model_layers(heads, schema);
    ResultSet set(dir, "locality.json");
    write_locality_files(set, r);
    meta.results() = {{"images", r.images}, {"uniform_baseline", r.uniform_baseline},
                      {"ms_per_image", timer.summary()}};
    if (!baselines.empty()) meta.results()["uniform_baseline_per_layer"] = baselines;
    // The local term (/layers/L/local) is apart from W V in the dump: its share of the output.
    std::vector<analyses::LocalShareHead> shares = analyses::local_share(reader, sel);
    if (!shares.empty()) {
      report_model_layers(shares, schema);
      write_local_share(set, shares);
      double mean = 0.0;
      for (const auto& h : shares) mean += h.share.mean / static_cast<double>(shares.size());
      meta.results()["local_share_mean"] = mean;
    }
    if (f.fold_local) {  // the folded map's mass, in one pass after the run (as local_share)
      analyses::FoldedLocality folded =
          analyses::folded_locality(reader, sel, variants, f.window, f.reference);
      analyses::LocalityResult rf = r;
      rf.per_head = std::move(folded.per_head);
      for (auto& heads : rf.per_head) drop_missing_heads(heads, schema);
      for (auto& heads : rf.per_head) report_model_layers(heads, schema);
      write_locality_files(set, rf, "locality_folded.csv");
    }
    meta.publish(set);
  };
  if (!run.finish(apply, publish)) return 0;
  print_summary(totals.result());
  return 0;
}

const CommandRegistration kRegistration{
    {"locality", "attention mass in each query's k x k grid window, per layer and head", run_locality_cmd,
     true}};

}  // namespace
}  // namespace attnscope::app
