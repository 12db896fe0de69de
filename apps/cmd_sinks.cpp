// attnscope sinks: the attention each key receives, heads where one key takes more than
// --threshold of every query's row, and high-norm tokens of v (or out) per layer.
#include "command.hpp"
#include "common.hpp"
#include "diagnostic_options.hpp"
#include "attnscope/run/image_run.hpp"
#include "attnscope/run/record_arrays.hpp"
#include "selection_flags.hpp"

#include "attnscope/analyses/sinks.hpp"

#include <iomanip>
#include <iostream>
#include <map>

namespace attnscope::app {
namespace {

struct SinksFlags {
  CommonOptions common;
  SelectionFlags sel;
  analyses::SinkOptions opt;
  std::string norms = "v";
  bool reference = false;
  RunControl control;
};

po::options_description sinks_options(SinksFlags& f) {
  po::options_description d("options");
  add_diagnostic_input_options(d, f.common, f.sel, "results/sinks");
  d.add_options()
      ("threshold", po::value(&f.opt.threshold)->value_name("T")->default_value(f.opt.threshold, "0.5"),
       "a head has a sink where one key takes more than T of every query's row")
      ("norms", po::value(&f.norms)->value_name("v|out|none")->default_value(f.norms),
       "high-norm tokens of the values (v), of the model's attention output (out, needs /layers/L/out), "
       "or none")
      ("norm-ratio", po::value(&f.opt.norm_ratio)->value_name("R")->default_value(f.opt.norm_ratio, "4"),
       "a token is high-norm when its norm over the layer's heads exceeds R times the median")
      ("reference", po::bool_switch(&f.reference), "plain double-precision loops (slow; for checks)");
  add_diagnostic_run_options(d, f.common, f.control);
  return d;
}

nlohmann::json to_record(const analyses::SinksImage& img) {
  nlohmann::json heads = nlohmann::json::array();
  for (const auto& slots : img.heads) {
    nlohmann::json received = nlohmann::json::array();
    std::vector<std::vector<int>> sinks;
    std::vector<int> valid, degenerate;
    for (const auto& h : slots) {
      received.push_back(run::packed_array(h.received));
      sinks.push_back(h.sink_keys);
      valid.push_back(h.valid_rows);
      degenerate.push_back(h.degenerate);
    }
    heads.push_back({{"received", std::move(received)}, {"sink_keys", sinks}, {"valid_rows", valid}, {"degenerate", degenerate}});
  }
  nlohmann::json norms = nlohmann::json::array();
  for (const auto& n : img.norms) {
    const std::vector<std::int64_t> high(n.high.begin(), n.high.end());
    norms.push_back({{"ratio", run::packed_array(n.ratio)}, {"high", run::packed_array(high)}, {"median", n.median}});
  }
  return {{"heads", heads}, {"norms", norms}};
}

analyses::SinksImage from_record(int image, const nlohmann::json& r, const analyses::Selection& sel) {
  analyses::SinksImage img;
  img.image = image;
  const std::string what = "sinks: image " + std::to_string(image);
  for (const auto& v : r.at("heads")) {
    const auto received = run::unpacked_double_rows(v.at("received"), what);
    const auto sinks = v.at("sink_keys").get<std::vector<std::vector<int>>>();
    const auto valid = v.at("valid_rows").get<std::vector<int>>();
    const auto degenerate = v.at("degenerate").get<std::vector<int>>();
    if (sinks.size() != received.size() || valid.size() != received.size() || degenerate.size() != received.size()) {
      throw Error(what + ": a malformed record");
    }
    std::vector<analyses::HeadSinks> slots(received.size());
    for (std::size_t s = 0; s < slots.size(); ++s) {
      slots[s].received = received[s];
      slots[s].sink_keys = sinks[s];
      slots[s].valid_rows = valid[s];
      slots[s].degenerate = degenerate[s];
    }
    img.heads.push_back(std::move(slots));
  }
  std::size_t ls = 0;
  for (const auto& n : r.at("norms")) {
    analyses::LayerNorms ln;
    ln.layer = ls < sel.layers.size() ? sel.layers[ls] : -1;
    ln.ratio = run::unpacked_doubles(n.at("ratio"), what);
    const auto high = run::unpacked_int64s(n.at("high"), what);
    ln.high.assign(high.begin(), high.end());
    ln.median = n.at("median").get<double>();
    img.norms.push_back(std::move(ln));
    ++ls;
  }
  return img;
}

/// Grid row and column of a token, -1 -1 for prefix tokens.
std::string cell_of(const TokenGrid& g, int t) {
  return g.on_grid(t) ? std::to_string(g.row(t)) + "," + std::to_string(g.col(t)) : "-1,-1";
}

std::size_t top_key(const analyses::SinksHeadTotal& h) {
  std::size_t best = 0;
  for (std::size_t j = 1; j < h.received_sum.size(); ++j) {
    if (h.received_sum[j] > h.received_sum[best]) best = j;
  }
  return best;
}

void write_csvs(ResultSet& set, const analyses::SinksResult& r, const TokenGrid& grid) {
  {
    ResultFile f(set, "sinks.csv");
    f.stream() << "variant,layer,head,images,sink_images,sink_share,top_key,top_key_received,prefix_received,"
                  "mean_max_received,degenerate_rows\n"
               << std::setprecision(10);
    for (std::size_t v = 0; v < r.variants.size(); ++v) {
      for (const auto& h : r.heads[v]) {
        const double n = h.images > 0 ? static_cast<double>(h.images) : 1.0;
        const std::size_t top = top_key(h);
        double prefix = 0.0;
        for (int j = 0; j < grid.prefix; ++j) prefix += h.received_sum[static_cast<std::size_t>(j)];
        f.stream() << analyses::row_variant_name(r.layer_variant_names, r.variants[v], h.layer)
                   << "," << h.layer << "," << h.head << "," << h.images << ","
                   << h.images_with_sink << "," << static_cast<double>(h.images_with_sink) / n
                   << "," << top << "," << h.received_sum[top] / n << "," << prefix / n << ","
                   << h.top_received_sum / n << "," << h.degenerate_rows << "\n";
      }
    }
    f.close();
  }
  {
    ResultFile f(set, "sinks_keys.csv");
    f.stream() << "variant,layer,head,token,grid_row,grid_col,mean_received,sink_images\n" << std::setprecision(10);
    for (std::size_t v = 0; v < r.variants.size(); ++v) {
      for (const auto& h : r.heads[v]) {
        const double n = h.images > 0 ? static_cast<double>(h.images) : 1.0;
        for (std::size_t j = 0; j < h.received_sum.size(); ++j) {
          f.stream() << analyses::row_variant_name(r.layer_variant_names, r.variants[v], h.layer)
                     << "," << h.layer << "," << h.head << "," << j << ","
                     << cell_of(grid, static_cast<int>(j)) << "," << h.received_sum[j] / n << ","
                     << h.sink_images[j] << "\n";
        }
      }
    }
    f.close();
  }
  if (r.layers.empty()) return;
  ResultFile f(set, "sinks_norms.csv");
  f.stream() << "layer,token,grid_row,grid_col,mean_norm_ratio,high_norm_images,images\n" << std::setprecision(10);
  for (const auto& l : r.layers) {
    const double n = l.images > 0 ? static_cast<double>(l.images) : 1.0;
    for (std::size_t j = 0; j < l.ratio_sum.size(); ++j) {
      f.stream() << l.layer << "," << j << "," << cell_of(grid, static_cast<int>(j)) << "," << l.ratio_sum[j] / n
                 << "," << l.high_images[j] << "," << l.images << "\n";
    }
  }
  f.close();
}

/// Per variant, per layer: the share of (image, head) pairs with a sink.
std::map<int, double> sink_share_per_layer(const std::vector<analyses::SinksHeadTotal>& heads) {
  std::map<int, std::pair<std::int64_t, std::int64_t>> c;
  for (const auto& h : heads) {
    c[h.layer].first += h.images_with_sink;
    c[h.layer].second += h.images;
  }
  std::map<int, double> out;
  for (const auto& [layer, p] : c) out[layer] = p.second > 0 ? static_cast<double>(p.first) / static_cast<double>(p.second) : 0.0;
  return out;
}

nlohmann::json results_json(const analyses::SinksResult& r) {
  nlohmann::json variants = nlohmann::json::array();
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    nlohmann::json layers = nlohmann::json::array();
    std::int64_t with = 0, pairs = 0;
    for (const auto& h : r.heads[v]) {
      with += h.images_with_sink;
      pairs += h.images;
    }
    for (const auto& [layer, share] : sink_share_per_layer(r.heads[v])) {
      layers.push_back({{"layer", layer}, {"sink_share", share}});
    }
    variants.push_back(
        {{"variant", analyses::all_layers_variant_name(r.layer_variant_names, r.variants[v])},
         {"sink_share", pairs > 0 ? static_cast<double>(with) / static_cast<double>(pairs) : 0.0},
         {"per_layer", layers}});
  }
  nlohmann::json norms = nlohmann::json::array();
  for (const auto& l : r.layers) {
    norms.push_back({{"layer", l.layer},
                     {"high_norm_tokens_per_image", l.images > 0 ? static_cast<double>(l.high_tokens) / static_cast<double>(l.images) : 0.0}});
  }
  return {{"variants", variants}, {"norms", norms}};
}

void print_summary(const analyses::SinksResult& r, const analyses::SinkOptions& opt) {
  std::cout << "attention sinks (" << r.images << " images; a sink: one key above " << opt.threshold
            << " of every query's row)\n"
            << std::left << std::setw(28) << "variant" << "per layer, share of (image, head) pairs with a sink\n";
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    std::cout << std::setw(28)
              << analyses::all_layers_variant_name(r.layer_variant_names, r.variants[v]);
    for (const auto& [layer, share] : sink_share_per_layer(r.heads[v])) {
      std::cout << " " << std::fixed << std::setprecision(3) << share;
    }
    std::cout << std::defaultfloat << "\n";
  }
  if (r.layers.empty()) return;
  std::cout << "high-norm tokens (||" << to_string(opt.norms) << "|| above " << opt.norm_ratio
            << " x the layer's median), per layer, mean per image:";
  for (const auto& l : r.layers) {
    std::cout << " " << std::fixed << std::setprecision(2)
              << (l.images > 0 ? static_cast<double>(l.high_tokens) / static_cast<double>(l.images) : 0.0);
  }
  std::cout << std::defaultfloat << "\n";
}

int run_sinks_cmd(const std::vector<std::string>& args) {
  SinksFlags f;
  const po::options_description desc = sinks_options(f);
  po::variables_map vm;
  if (!parse_args("sinks", "--dump FILE [options]", desc, args, vm)) return 0;
  f.opt.norms = analyses::parse_norm_source(f.norms);
  analyses::check_sink_options(f.opt);
  const int threads = apply_threads(f.common.threads);
  const ResolvedDevice device = apply_device("sinks", f.common, false);
  DumpReader reader(f.common.dump);
  const DumpSchema& schema = reader.schema();
  std::map<int, std::string> own_names;  // each layer's own variant's, on a hybrid dump
  const analyses::Selection sel =
      with_own_variants(make_selection(f.sel, schema, f.common.seed), f.common, schema, own_names,
                        "a sink is one key that every query of the layer attends to: with windows "
                        "a key is seen by its own window's queries only, and reduced keys are no "
                        "tokens of the layer, so the measure is not defined there");
  const std::vector<Variant> variants = resolve_variants(f.common, schema, sel.layers);
  const std::filesystem::path dir = ensure_out_dir(f.common.out);

  RunMetadata meta("sinks");
  meta.inputs() = {{"dump", f.common.dump}};
  meta.params() =
      diagnostic_params(variants, sel, schema, f.reference, threads, f.common, device, own_names);
  meta.params().update({{"threshold", f.opt.threshold},
                        {"norms", to_string(f.opt.norms)},
                        {"norm_ratio", f.opt.norm_ratio},
                        {"queries_and_keys", "every token, prefix tokens included"}});
  ImageRun run(f.control, "sinks", command_args(args), dir, run_fingerprint("sinks", f.common.dump, meta.params()), sel.images);
  ImageTimer timer;
  run.compute([&] {
    analyses::Selection part = sel;
    part.images = run.pending();
    Progress progress("sinks", part.images.size());
    analyses::sinks_images(reader, part, variants, f.opt, f.reference, [&](analyses::SinksImage&& img) {
      run.record(img.image, to_record(img));
      timer.tick();
      progress.tick();
    });
    progress.finish();
  });
  analyses::SinksTotals totals(variants, sel, schema.attrs.num_tokens, f.opt.norms != analyses::NormSource::None);
  totals.result().layer_variant_names = own_names;
  auto apply = [&](int image, const nlohmann::json& rec) { totals.add(from_record(image, rec, sel)); };
  auto publish = [&] {
    analyses::SinksResult& r = totals.result();
    std::int64_t measured = 0;
    for (const auto& hs : r.heads) {
      for (const auto& h : hs) measured += h.images;
    }
    require_measured_rows(measured, "no key receives attention to measure");
    for (auto& hs : r.heads) drop_missing_heads(hs, schema);
    for (auto& hs : r.heads) report_model_layers(hs, schema);
    report_model_layers(r.layers, schema);
    ResultSet set(dir, "sinks.json");
    write_csvs(set, r, schema.attrs.grid);
    meta.results() = results_json(r);
    meta.results()["images"] = r.images;
    meta.results()["ms_per_image"] = timer.summary();
    meta.publish(set);
  };
  if (!run.finish(apply, publish)) return 0;
  print_summary(totals.result(), f.opt);
  return 0;
}

const CommandRegistration kRegistration{
    {"sinks", "attention each key receives, sink heads (one key above --threshold of every row), high-norm tokens",
     run_sinks_cmd, true}};

}  // namespace
}  // namespace attnscope::app
