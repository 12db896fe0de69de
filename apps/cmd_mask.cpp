// attnscope mask: the layer-local view of InLine Table 2 on a dump: remove each query's local
// window or random keys outside its 3 x 3 window, renormalise as each family defines it, and
// report how far each head's attention output moves (masking.hpp).
#include "command.hpp"
#include "common.hpp"
#include "selection_flags.hpp"

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
};

po::options_description mask_options(MaskFlags& f) {
  po::options_description d("options");
  add_dump_option(d, f.common);
  add_out_option(d, f.common, "results/mask");
  add_variant_option(d, f.common);
  add_selection_options(d, f.sel, false);
  d.add_options()("mask", po::value(&f.masks)->value_name("LIST")->default_value(f.masks),
                  "masks: local:K (each grid query loses its K x K window, itself included; K odd) "
                  "and random:N (N random keys outside its 3 x 3 window, the same draw for every "
                  "family)");
  add_threads_option(d, f.common);
  add_device_option(d, f.common);
  add_seed_option(d, f.common);
  return d;
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

void print_table(const std::vector<analyses::MaskCell>& ts, const std::vector<Variant>& variants,
                 const std::vector<analyses::MaskSpec>& masks, std::size_t images) {
  std::cout << "|O' - O| / |O| per head, mean (std) over " << images
            << " images x layers x heads; removed mass per query in brackets\n"
            << std::left << std::setw(12) << "mask";
  for (const Variant& v : variants) std::cout << std::setw(34) << v.name();
  std::cout << "\n";
  for (const auto& m : masks) {
    std::cout << std::setw(12) << m.name();
    for (const Variant& v : variants) {
      const auto it = std::find_if(ts.begin(), ts.end(), [&](const analyses::MaskCell& t) {
        return t.variant == v.name() && t.mask == m.name();
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
  const analyses::Selection sel = make_selection(f.sel, schema, f.common.seed);
  const std::vector<Variant> variants = resolve_variants(f.common, schema);
  analyses::MaskCollector collector(variants, masks, sel, schema.attrs.grid, schema.attrs.scale,
                                    f.common.seed);
  collector.set_device(device.used);
  const std::filesystem::path dir = ensure_out_dir(f.common.out);

  ResultSet set(dir, "mask.json");
  RunMetadata meta("mask");
  meta.inputs() = {{"dump", f.common.dump}};
  nlohmann::json mask_names = nlohmann::json::array();
  for (const auto& m : masks) mask_names.push_back(m.name());
  meta.params() = {{"variants", variant_names(variants)},
                   {"masks", mask_names},
                   {"images", sel.images.size()},
                   {"layers", model_layers_of(schema, sel.layers)},
                   {"heads", sel.heads},
                   {"seed", f.common.seed},
                   {"precision", "double"},
                   {"threads", threads}};
  meta.params()["device"] = device.description;
  Progress progress("mask", sel.images.size());
  analyses::for_each_head(
      reader, sel, [&](const analyses::HeadView& h) { collector.add_head(h); },
      [&](int) { progress.tick(); });
  progress.finish();
  auto cells = collector.cells();
  long long measured = 0;
  for (const auto& c : cells) measured += c.change.count;
  require_measured_rows(measured, "no head output could be compared");
  report_model_layers(cells, schema);
  write_csv(set, "mask_per_head.csv", cells, true);
  const auto ts = totals(cells);
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
  print_table(ts, variants, masks, sel.images.size());
  return 0;
}

const CommandRegistration kRegistration{
    {"mask", "remove local windows or random keys from every query, renormalise per family, and "
             "measure how far each head's output moves (InLine Table 2, layer by layer)",
     run_mask_cmd}};

}  // namespace
}  // namespace attnscope::app
