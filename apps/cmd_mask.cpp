// attnscope mask: the layer-local view of InLine Table 2 on a dump: remove each query's local
// window or random keys outside its 3 x 3 window, renormalise as each family defines it, and
// report how far each head's attention output moves (masking.hpp).
#include "command.hpp"
#include "common.hpp"
#include "attnscope/run/image_run.hpp"
#include "model_layers.hpp"
#include "selection_flags.hpp"
#include "stats_record.hpp"

#include "attnscope/analyses/masking.hpp"

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <sstream>

namespace attnscope::app {
namespace {

struct MaskFlags {
  CommonOptions common;
  SelectionFlags sel;
  std::string masks{analyses::kDefaultMasks};
  RunControl control;
};

po::options_description mask_options(MaskFlags& f) {
  po::options_description d("options");
  add_dump_option(d, f.common);
  add_out_option(d, f.common, "results/mask");
  add_variant_option(d, f.common, dumps_own_variant(true));
  add_selection_options(d, f.sel, false);
  d.add_options()("mask", po::value(&f.masks)->value_name("LIST")->default_value(f.masks),
                  "masks: local:K (each grid query loses its K x K window, itself included; K odd) "
                  "and random:N (N random keys outside its 3 x 3 window, the same draw for every "
                  "family)");
  add_threads_option(d, f.common);
  add_device_option(d, f.common);
  add_seed_option(d, f.common);
  add_run_control_options(d, f.control);
  return d;
}

/// An image's record: its cells (in the collector's order), one array per field. The change of
/// a head in one image is one value (null where no row was left to compare); the removed mass is
/// the statistics over the image's masked queries.
nlohmann::json to_record(const std::vector<analyses::MaskCell>& cells) {
  nlohmann::json change = nlohmann::json::array();
  StatsColumns removed;
  std::vector<long long> empty, degenerate;
  for (const auto& c : cells) {
    // One value or one unmeasured head; neither for a head its layer lacks (dropped when written).
    if (c.change.count + c.unmeasured_heads > 1) {
      throw Error("internal: a mask cell is not one image's");
    }
    change.push_back(c.change.count ? nlohmann::json(c.change.mean) : nlohmann::json());
    removed.push(c.removed_mass);
    empty.push_back(c.empty_rows);
    degenerate.push_back(c.degenerate_rows);
  }
  nlohmann::json r = {{"change", change}, {"empty_rows", empty}, {"degenerate_rows", degenerate}};
  removed.write(r, "removed_");
  return r;
}

std::vector<analyses::MaskCell> from_record(int image, const nlohmann::json& r) {
  const nlohmann::json& change = r.at("change");
  const auto empty = r.at("empty_rows").get<std::vector<long long>>();
  const auto degenerate = r.at("degenerate_rows").get<std::vector<long long>>();
  const std::size_t n = empty.size();
  const std::string what = "mask: image " + std::to_string(image);
  const StatsColumns removed = StatsColumns::read(r, "removed_", n, what);
  if (!change.is_array() || change.size() != n || degenerate.size() != n) {
    throw Error(what + ": a malformed record");
  }
  std::vector<analyses::MaskCell> cells(n);
  for (std::size_t i = 0; i < n; ++i) {
    analyses::MaskCell& c = cells[i];
    if (change[i].is_null()) {
      c.unmeasured_heads = 1;
    } else {
      c.change.add(change[i].get<double>());
    }
    c.removed_mass = removed.at(i);
    c.empty_rows = empty[i];
    c.degenerate_rows = degenerate[i];
  }
  return cells;
}

/// Per (variant, mask): every layer and head folded together, in the order given.
std::vector<analyses::MaskCell> totals(const std::vector<analyses::MaskCell>& cells) {
  std::vector<analyses::MaskCell> out;
  for (const auto& c : cells) {
    auto it = std::find_if(out.begin(), out.end(), [&](const analyses::MaskCell& t) {
      return t.variant == c.variant && t.mask == c.mask;
    });
    if (it == out.end()) {
      analyses::MaskCell t;
      t.variant = c.variant;
      t.mask = c.mask;
      t.layer = t.head = -1;
      out.push_back(t);
      it = out.end() - 1;
    }
    it->merge(c);
  }
  return out;
}

void write_csv(ResultSet& set, const std::string& name, const std::vector<analyses::MaskCell>& cells,
               bool per_head) {
  ResultFile f(set, name);
  f.stream() << "variant,mask," << (per_head ? "layer,head," : "")
             << "values,change_mean,change_std,change_min,change_max,removed_mass_mean,"
                "removed_mass_std,empty_rows,degenerate_rows,unmeasured\n"
             << std::setprecision(17);
  for (const auto& c : cells) {
    f.stream() << c.variant << "," << c.mask << ",";
    if (per_head) f.stream() << c.layer << "," << c.head << ",";
    // Statistics over no value are left empty, never written as 0 or inf.
    f.stream() << c.change.count << ",";
    if (c.change.count) {
      f.stream() << c.change.mean << "," << c.change.stddev() << "," << c.change.min << "," << c.change.max;
    } else {
      f.stream() << ",,,";
    }
    f.stream() << ",";
    if (c.removed_mass.count) f.stream() << c.removed_mass.mean << "," << c.removed_mass.stddev();
    else f.stream() << ",";
    f.stream() << "," << c.empty_rows << "," << c.degenerate_rows << "," << c.unmeasured_heads << "\n";
  }
  f.close();
}

void print_table(const std::vector<analyses::MaskCell>& ts,
                 const std::vector<analyses::MaskSpec>& masks, std::size_t images) {
  // The variants as the totals name them (with each layer's own: each family of the layers).
  std::vector<std::string> names;
  for (const auto& t : ts) {
    if (std::find(names.begin(), names.end(), t.variant) == names.end()) names.push_back(t.variant);
  }
  std::cout << "|O' - O| / |O| per head, mean (std) over " << images
            << " images x layers x heads; removed mass per query in brackets\n"
            << std::left << std::setw(12) << "mask";
  for (const std::string& v : names) std::cout << std::setw(34) << v;
  std::cout << "\n";
  for (const auto& m : masks) {
    std::cout << std::setw(12) << m.name();
    for (const std::string& v : names) {
      const auto it = std::find_if(ts.begin(), ts.end(), [&](const analyses::MaskCell& t) {
        return t.variant == v && t.mask == m.name();
      });
      std::ostringstream cell;
      cell << std::setprecision(3) << it->change.mean << " (" << it->change.stddev() << ") ["
           << it->removed_mass.mean << "]";
      if (it->empty_rows) cell << " " << it->empty_rows << " empty";
      std::cout << std::setw(34) << cell.str();
    }
    std::cout << "\n";
  }
}

int run_mask_cmd(const std::vector<std::string>& args) {
  MaskFlags f;
  const po::options_description desc = mask_options(f);
  po::variables_map vm;
  if (!parse_args("mask", "--dump FILE [options]", desc, args, vm)) return 0;
  const int threads = apply_threads(f.common.threads);
  const ResolvedDevice device = apply_device("mask", f.common, true);
  const std::vector<analyses::MaskSpec> masks = analyses::parse_mask_specs(f.masks);
  DumpReader reader(f.common.dump);
  const DumpSchema& schema = reader.schema();
  analyses::Selection sel = make_selection(f.sel, schema, f.common.seed);
  sel.any_geometry = true;  // windows and reduced keys masked unit by unit (masking.hpp)
  sel.own_variants = layers_own_variants(f.common, schema, sel.layers);  // a hybrid dump's
  const std::map<int, std::string> own_names =
      own_variant_names(schema, sel.own_variants, sel.layers);
  const std::vector<Variant> variants = resolve_variants(f.common, schema, sel.layers);
  analyses::MaskCollector collector(variants, masks, sel, schema.attrs.grid, schema.attrs.scale,
                                    f.common.seed);
  const std::filesystem::path dir = ensure_out_dir(f.common.out);

  RunMetadata meta("mask");
  meta.inputs() = {{"dump", f.common.dump}};
  nlohmann::json mask_names = nlohmann::json::array();
  for (const auto& m : masks) mask_names.push_back(m.name());
  meta.params() = {{"variants", variants_json(variants, own_names)},
                   {"masks", mask_names},
                   {"images", sel.images.size()},
                   {"layers", model_layers_of(schema, sel.layers)},
                   {"heads", sel.heads},
                   {"seed", f.common.seed},
                   {"precision", "double"},
                   {"threads", threads}};
  meta.params()["device"] = device.description;
  if (const nlohmann::json geo = layer_geometry_json(schema, sel.layers); !geo.is_null()) {
    meta.params()["layer_geometry"] = geo;
    meta.params()["units"] =
        "windows: local:k removes the window's keys in the query's k x k cells, random:n draws "
        "among the keys the window's mask allows outside the query's 3 x 3 cells; reduced keys: "
        "the query's cell mapped onto the key grid (row * key height / height, rounded down); the "
        "change over every window's rows together; on the CPU";
  }
  ImageRun run(f.control, "mask", command_args(args), dir,
               run_fingerprint("mask", f.common.dump, meta.params()), sel.images);
  run.compute([&] {
    analyses::Selection part = sel;
    part.images = run.pending();
    Progress progress("mask", part.images.size());
    analyses::mask_images(reader, part, variants, masks, schema.attrs.grid, schema.attrs.scale,
                          f.common.seed, [&](int image, std::vector<analyses::MaskCell>&& cells) {
                            run.record(image, to_record(cells));
                            progress.tick();
                          },
                          device.used);
    progress.finish();
  });

  auto apply = [&](int image, const nlohmann::json& rec) { collector.add(from_record(image, rec)); };
  std::vector<analyses::MaskCell> ts;
  auto publish = [&] {
    auto cells = collector.cells();
    long long measured = 0;
    for (const auto& c : cells) measured += c.change.count;
    require_measured_rows(measured, "no head output could be compared");
    drop_missing_heads(cells, schema);
    report_model_layers(cells, schema);
    ResultSet set(dir, "mask.json");
    write_csv(set, "mask_per_head.csv", cells, true);
    ts = totals(cells);
    write_csv(set, "mask.csv", ts, false);
    nlohmann::json jt = nlohmann::json::array();
    for (const auto& t : ts) {
      jt.push_back({{"variant", t.variant},
                    {"mask", t.mask},
                    {"change_mean", t.change.mean},
                    {"change_std", t.change.stddev()},
                    {"removed_mass_mean", t.removed_mass.mean},
                    {"empty_rows", t.empty_rows},
                    {"degenerate_rows", t.degenerate_rows}});
    }
    meta.results() = {{"totals", jt}};
    meta.publish(set);
  };
  if (!run.finish(apply, publish)) return 0;
  print_table(ts, masks, sel.images.size());
  return 0;
}

const CommandRegistration kRegistration{
    {"mask", "remove local windows or random keys from every query, renormalise per family, and "
             "measure how far each head's output moves (InLine Table 2, layer by layer)",
     run_mask_cmd, true}};

}  // namespace
}  // namespace attnscope::app
