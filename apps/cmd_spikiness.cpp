// attnscope spikiness: scale queries by every factor of a sweep and report, per family, how the
// attention row sharpens (MALA Fig. 2), checking MALA eq. 6, 7, 11, 12 and InLine eq. 4 as it goes.
#include "command.hpp"
#include "common.hpp"
#include "attnscope/run/image_run.hpp"
#include "selection_flags.hpp"
#include "attnscope/run/sha256.hpp"

#include "attnscope/analyses/spikiness_run.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

namespace attnscope::app {
namespace {

constexpr const char* kDefaultVariants = "softmax,linear:relu,inline,mala";

struct SpikinessFlags {
  CommonOptions common;
  SelectionFlags sel;
  bool synthetic = false;
  int synth_images = 2;
  std::string tokens;
  int samples = 64;
  std::string scales = "0.25:8:33";
  std::string keys = "top,median";
  std::string space = "auto";
  int topk = 5;
  int dist_samples = 1;
  RunControl control;
};

po::options_description spikiness_options(SpikinessFlags& f) {
  po::options_description d("options");
  add_dump_option(d, f.common, "--synthetic");
  d.add_options()(
      "synthetic", po::bool_switch(&f.synthetic),
      "use synthetic heads (the `synth` model, seeded by --seed) instead of a dump")(
      "synth-images", po::value(&f.synth_images)->value_name("N")->default_value(f.synth_images),
      "images of the synthetic model");
  add_out_option(d, f.common, "results/spikiness");
  add_variant_option(d, f.common, variants_under_dump_convention(kDefaultVariants));
  add_selection_options(d, f.sel, true);
  d.add_options()(
      "tokens", po::value(&f.tokens)->value_name("LIST"),
      "query tokens of every selected image, layer and head (default: a random sample)")(
      "samples", po::value(&f.samples)->value_name("N")->default_value(f.samples),
      "random queries drawn from the selection when --tokens is not given")(
      "scales", po::value(&f.scales)->value_name("LO:HI:N|A,B,..")->default_value(f.scales),
      "magnitude factors a: N log-spaced from LO to HI, or a list")(
      "keys", po::value(&f.keys)->value_name("HIGH,LOW")->default_value(f.keys),
      "reference keys of the ratio, chosen at a = 1: top, median, bottom or a key index")(
      "scale-space", po::value(&f.space)->value_name("S")->default_value(f.space),
      "what a scales for the kernel families: feature (phi(q), the laws' setting), query (q), "
      "auto (feature; softmax always scales q)")(
      "topk", po::value(&f.topk)->value_name("K")->default_value(f.topk), "top-k mass")(
      "dist-samples", po::value(&f.dist_samples)->value_name("N")->default_value(f.dist_samples),
      "samples whose sorted weights go to spikiness_weights.csv");
  add_threads_option(d, f.common);
  add_device_option(d, f.common);
  add_seed_option(d, f.common);
  add_run_control_options(d, f.control);
  return d;
}

/// An image's record: the indices of its samples, per variant their sweeps ([key_high, key_low,
/// eight numbers per point, the kept rows]) and the laws they fed.
nlohmann::json to_record(const analyses::SpikinessImage& img) {
  nlohmann::json sweeps = nlohmann::json::array(), laws = nlohmann::json::array();
  for (const auto& per_variant : img.sweeps) {
    nlohmann::json v = nlohmann::json::array();
    for (const analyses::QuerySweep& q : per_variant) {
      std::vector<double> points;
      points.reserve(8 * q.points.size());
      for (const auto& p : q.points) {
        points.insert(points.end(), {p.scale, p.ratio, p.stats.max_weight, p.stats.entropy,
                                     p.stats.effective_keys, p.stats.topk_mass,
                                     static_cast<double>(p.stats.negatives),
                                     static_cast<double>(p.stats.zeros)});
      }
      nlohmann::json rows = nlohmann::json::array();
      for (const VecD& w : q.weights) rows.push_back(std::vector<double>(w.data(), w.data() + w.size()));
      v.push_back({q.key_high, q.key_low, std::move(points), std::move(rows)});
    }
    sweeps.push_back(std::move(v));
  }
  for (const auto& per_variant : img.laws) {
    nlohmann::json v = nlohmann::json::array();
    for (const analyses::LawResult& l : per_variant) {
      v.push_back({l.variant, static_cast<int>(l.law), l.max_deviation, l.queries, l.points,
                   l.skipped, l.applicable, l.why, l.threshold});
    }
    laws.push_back(std::move(v));
  }
  return {{"samples", img.samples}, {"sweeps", std::move(sweeps)}, {"laws", std::move(laws)}};
}

analyses::SpikinessImage from_record(int image, const nlohmann::json& r) {
  analyses::SpikinessImage img;
  img.image = image;
  try {
    img.samples = r.at("samples").get<std::vector<std::size_t>>();
    for (const nlohmann::json& v : r.at("sweeps")) {
      std::vector<analyses::QuerySweep> sweeps;
      for (const nlohmann::json& j : v) {
        analyses::QuerySweep q;
        q.key_high = j.at(0).get<int>();
        q.key_low = j.at(1).get<int>();
        const auto points = j.at(2).get<std::vector<double>>();
        if (points.size() % 8 != 0) throw Error("points");
        for (std::size_t p = 0; p < points.size(); p += 8) {
          analyses::SweepPoint pt;
          pt.scale = points[p];
          pt.ratio = points[p + 1];
          pt.stats.max_weight = points[p + 2];
          pt.stats.entropy = points[p + 3];
          pt.stats.effective_keys = points[p + 4];
          pt.stats.topk_mass = points[p + 5];
          pt.stats.negatives = static_cast<int>(points[p + 6]);
          pt.stats.zeros = static_cast<int>(points[p + 7]);
          q.points.push_back(pt);
        }
        for (const nlohmann::json& row : j.at(3)) {
          const auto w = row.get<std::vector<double>>();
          q.weights.push_back(Eigen::Map<const VecD>(w.data(), static_cast<Eigen::Index>(w.size())));
        }
        sweeps.push_back(std::move(q));
      }
      img.sweeps.push_back(std::move(sweeps));
    }
    for (const nlohmann::json& v : r.at("laws")) {
      std::vector<analyses::LawResult> laws;
      for (const nlohmann::json& j : v) {
        analyses::LawResult l;
        l.variant = j.at(0).get<std::string>();
        l.law = static_cast<analyses::Law>(j.at(1).get<int>());
        l.max_deviation = j.at(2).get<double>();
        l.queries = j.at(3).get<long>();
        l.points = j.at(4).get<long>();
        l.skipped = j.at(5).get<long>();
        l.applicable = j.at(6).get<bool>();
        l.why = j.at(7).get<std::string>();
        l.threshold = j.at(8).get<double>();
        laws.push_back(std::move(l));
      }
      img.laws.push_back(std::move(laws));
    }
  } catch (const std::exception&) {
    throw Error("spikiness: a malformed record of image " + std::to_string(image));
  }
  return img;
}

/// What identifies the sampled queries (for --resume and merge): the SHA-256 of their indices.
std::string samples_digest(const std::vector<analyses::QuerySample>& samples) {
  Sha256 h;
  for (const auto& s : samples) {
    const std::int64_t v[4] = {s.image, s.layer, s.head, s.token};
    h.update(v, sizeof v);
  }
  return h.hex_digest();
}

void write_rows(ResultSet& set, const std::string& source, const analyses::SpikinessResult& r) {
  ResultFile f(set, "spikiness.csv");
  f.stream() << "variant,source,sample,layer,head,token,scale,ratio,max_weight,entropy,"
                "effective_keys,topk_mass,negatives,zeros\n"
             << std::setprecision(10);
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    const std::string name = r.variants[v].name();
    for (std::size_t i = 0; i < r.samples.size(); ++i) {
      const auto& s = r.samples[i];
      for (const auto& p : r.sweeps[v][i].points) {
        f.stream() << name << "," << source << "," << i << "," << s.layer << "," << s.head << ","
                   << s.token << "," << p.scale << "," << p.ratio << "," << p.stats.max_weight
                   << "," << p.stats.entropy << "," << p.stats.effective_keys << ","
                   << p.stats.topk_mass << "," << p.stats.negatives << "," << p.stats.zeros << "\n";
      }
    }
  }
  f.close();
}

void write_samples(ResultSet& set, const analyses::SpikinessResult& r) {
  ResultFile f(set, "spikiness_samples.csv");
  f.stream() << "variant,sample,image,layer,head,token,key_high,key_low\n";
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    for (std::size_t i = 0; i < r.samples.size(); ++i) {
      const auto& s = r.samples[i];
      f.stream() << r.variants[v].name() << "," << i << "," << s.image << "," << s.layer << ","
                 << s.head << "," << s.token << "," << r.sweeps[v][i].key_high << ","
                 << r.sweeps[v][i].key_low << "\n";
    }
  }
  f.close();
}

void write_weights(ResultSet& set, const analyses::SpikinessResult& r) {
  ResultFile f(set, "spikiness_weights.csv");
  f.stream() << "variant,sample,scale,rank,weight\n" << std::setprecision(10);
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    for (std::size_t i = 0; i < r.samples.size(); ++i) {
      const auto& sweep = r.sweeps[v][i];
      for (std::size_t j = 0; j < sweep.weights.size(); ++j) {
        std::vector<double> w(sweep.weights[j].data(),
                              sweep.weights[j].data() + sweep.weights[j].size());
        std::sort(w.begin(), w.end(), std::greater<>());
        for (std::size_t rank = 0; rank < w.size(); ++rank) {
          f.stream() << r.variants[v].name() << "," << i << "," << sweep.points[j].scale << ","
                     << rank << "," << w[rank] << "\n";
        }
      }
    }
  }
  f.close();
}

std::string law_verdict(const analyses::LawResult& l) {
  if (!l.applicable) return "n/a";
  if (!l.has_data()) return "NO DATA";
  return l.pass() ? "PASS" : "FAIL";
}

void write_laws(ResultSet& set, const analyses::SpikinessResult& r, std::size_t scales) {
  ResultFile f(set, "spikiness_laws.csv");
  f.stream() << "variant,law,max_deviation,queries,scales,pass\n" << std::setprecision(6);
  for (const auto& l : r.laws) {
    f.stream() << l.variant << "," << analyses::to_string(l.law) << "," << l.max_deviation << ","
               << l.queries << "," << scales << "," << law_verdict(l) << "\n";
  }
  f.close();
}

/// Median ratio and effective keys over samples at each scale, per variant (null: no value).
nlohmann::json medians_json(const analyses::SpikinessResult& r, std::size_t scales) {
  nlohmann::json j = nlohmann::json::object();
  const auto num = [](double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(); };
  const auto med = analyses::spikiness_medians(r, scales);
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& m : med[v]) {
      rows.push_back({{"scale", m.scale},
                      {"median_ratio", num(m.ratio)},
                      {"median_effective_keys", num(m.effective_keys)}});
    }
    j[r.variants[v].name()] = rows;
  }
  return j;
}

std::string short_number(const nlohmann::json& x) {
  if (x.is_null()) return "nan";
  std::ostringstream s;
  s << std::setprecision(6) << x.get<double>();
  return s.str();
}

void print_summary(const analyses::SpikinessResult& r, const nlohmann::json& med) {
  std::cout << "median over " << r.samples.size() << " queries at the smallest and largest scale "
            << "(ratio: higher vs lower reference key)\n"
            << std::left << std::setw(26) << "variant" << std::setw(10) << "scale" << std::setw(16)
            << "ratio"
            << "effective_keys\n";
  for (const Variant& v : r.variants) {
    const auto& rows = med.at(v.name());
    if (rows.empty()) continue;
    for (const auto* row : {&rows.front(), &rows.back()}) {
      std::cout << std::setw(26) << v.name() << std::setw(10) << short_number((*row)["scale"])
                << std::setw(16) << short_number((*row)["median_ratio"])
                << short_number((*row)["median_effective_keys"]) << "\n";
    }
  }
  std::cout << "\nlaws (largest relative deviation over every query and scale)\n";
  for (const auto& l : r.laws) {
    std::ostringstream dev;
    dev << std::setprecision(3) << l.max_deviation;
    std::cout << std::setw(26) << l.variant << std::setw(18) << analyses::to_string(l.law)
              << std::setw(12) << (l.applicable ? dev.str() : std::string("-")) << law_verdict(l);
    if (!l.applicable) std::cout << " (" << l.why << ")";
    if (l.skipped) std::cout << " (" << l.skipped << " points skipped: lower weight ~ 0)";
    std::cout << "\n";
  }
}

int run_spikiness_cmd(const std::vector<std::string>& args) {
  SpikinessFlags f;
  const po::options_description desc = spikiness_options(f);
  po::variables_map vm;
  if (!parse_args("spikiness", "--dump FILE | --synthetic [options]", desc, args, vm)) return 0;
  if (f.synthetic == !f.common.dump.empty())
    throw UsageError("give exactly one of --dump and --synthetic");
  if (f.topk < 1) throw UsageError("--topk must be >= 1, got " + std::to_string(f.topk));
  if (f.dist_samples < 0) throw UsageError("--dist-samples must be >= 0");
  if (f.synthetic && f.synth_images < 1) {
    throw UsageError("--synth-images must be >= 1, got " + std::to_string(f.synth_images));
  }
  analyses::SpikinessOptions opt;
  opt.scales = analyses::parse_scales(f.scales);
  opt.keys = analyses::parse_key_pair(f.keys);
  opt.topk = f.topk;
  opt.space = analyses::parse_scale_space(f.space);
  const int threads = apply_threads(f.common.threads);
  const ResolvedDevice device = apply_device("spikiness", f.common, false);

  std::unique_ptr<DumpReader> reader;
  SynthOptions so;
  if (f.synthetic) {
    so.images = f.synth_images;
    so.seed = f.common.seed;
    so.validate();
  } else {
    reader = std::make_unique<DumpReader>(f.common.dump);
  }
  const analyses::HeadSource source =
      f.synthetic ? analyses::HeadSource::synthetic(so) : analyses::HeadSource::dump(*reader);
  const DumpSchema& schema = source.schema();
  analyses::Selection sel = make_selection(f.sel, schema, f.common.seed);
  sel.geometry_why =
      "spikiness sweeps rows over the dump's one token grid; windows, keys from a reduced grid and "
      "other stages' grids are not measured yet";
  const std::vector<Variant> variants = resolve_variants(f.common, schema, sel.layers);
  const int n_tokens = schema.attrs.num_tokens;
  auto samples =
      f.tokens.empty()
          ? analyses::draw_samples(sel, n_tokens, f.samples, f.common.seed)
          : analyses::grid_samples(sel, n_tokens, analyses::parse_index_list(f.tokens, "--tokens"));
  // A dump whose layers differ in heads: the selection's heads go up to the most of any layer;
  // queries of heads a layer lacks are dropped (a dump of one head count keeps every draw).
  samples.erase(std::remove_if(samples.begin(), samples.end(),
                               [&](const analyses::QuerySample& q) {
                                 return q.head >= schema.geometry(q.layer).num_heads;
                               }),
                samples.end());
  if (samples.empty()) throw UsageError("no query selected (--samples 0?)");
  const std::filesystem::path dir = ensure_out_dir(f.common.out);

  RunMetadata meta("spikiness");
  meta.inputs() = {{"source", source.name()}, {"dump", f.common.dump}};
  meta.params() = {{"variants", variant_names(variants)},
                   {"scales", opt.scales},
                   {"keys", opt.keys.high.name() + "," + opt.keys.low.name()},
                   {"scale_space", f.space},
                   {"topk", opt.topk},
                   {"transform", sel.transform.name()},
                   {"samples", samples.size()},
                   {"dist_samples", f.dist_samples},
                   {"seed", f.common.seed},
                   {"threads", threads}};
  meta.params()["device"] = device.description;
  if (f.synthetic) meta.params()["synth_images"] = so.images;

  nlohmann::json identity = meta.params();
  identity["source"] = source.name();
  identity["queries_sha256"] = samples_digest(samples);
  ImageRun run(f.control, "spikiness", command_args(args), dir,
               run_fingerprint("spikiness",
                               f.synthetic ? std::vector<std::string>{} : std::vector<std::string>(f.common.dump),
                               identity),
               analyses::sample_images(samples));
  run.compute([&] {
    Progress progress("spikiness", run.pending().size());
    analyses::spikiness_images(source, sel, variants, samples, opt, f.dist_samples, run.pending(),
                               [&](analyses::SpikinessImage&& img) {
                                 run.record(img.image, to_record(img));
                                 progress.tick();
                               });
    progress.finish();
  });

  analyses::SpikinessCollector collector(variants, samples, schema.attrs.scale, opt, f.dist_samples);
  auto apply = [&](int image, const nlohmann::json& rec) { collector.add_image(from_record(image, rec)); };
  analyses::SpikinessResult r;
  nlohmann::json med;
  bool all_pass = true;
  auto publish = [&] {
    r = collector.finish();
    if (!analyses::has_ratio(r)) {
      throw NothingToMeasure("no valid queries: no sampled row has a positive weight on its reference "
                             "keys at any scale (every row is degenerate), so there is no ratio to report");
    }
    report_model_layers(r.samples, schema);
    ResultSet set(dir, "spikiness.json");
    write_rows(set, source.name(), r);
    write_samples(set, r);
    write_weights(set, r);
    write_laws(set, r, opt.scales.size());
    med = medians_json(r, opt.scales.size());
    nlohmann::json laws = nlohmann::json::array();
    for (const auto& l : r.laws) {
      all_pass = all_pass && l.pass();
      laws.push_back({{"variant", l.variant},
                      {"law", analyses::to_string(l.law)},
                      {"max_deviation", l.max_deviation},
                      {"queries", l.queries},
                      {"points", l.points},
                      {"skipped", l.skipped},
                      {"threshold", l.threshold},
                      {"result", law_verdict(l)},
                      {"why", l.why}});
    }
    meta.results() = {{"laws", laws}, {"medians", med}};
    meta.publish(set);
  };
  if (!run.finish(apply, publish)) return 0;
  print_summary(r, med);
  return all_pass ? 0 : kExitCheckFailed;
}

const CommandRegistration kRegistration{
    {"spikiness",
     "sweep query magnitude: weight ratio, entropy, top-k mass per family (MALA Fig. 2)",
     run_spikiness_cmd, true}};

}  // namespace
}  // namespace attnscope::app
