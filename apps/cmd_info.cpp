// attnscope info: prints and validates a dump's schema; --check-values also reads every value.
#include "command.hpp"
#include "common.hpp"

#include "attnscope/analyses/dump_loop.hpp"
#include "attnscope/dump.hpp"
#include "attnscope/dump_local_kernel.hpp"
#include "attnscope/error.hpp"
#include "attnscope/family.hpp"
#include "attnscope/variant.hpp"

#include <iomanip>
#include <iostream>
#include <sstream>

namespace attnscope::app {
namespace {

std::string shape_text(const std::vector<std::uint64_t>& v) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

/// The model's variant by its canonical name; a feature map the registry cannot parse makes the
/// dump invalid.
std::string variant_name(const DumpSchema& s) {
  try {
    return s.attrs.variant().name();
  } catch (const UsageError& e) {
    throw InputError(s.path, "attribute 'feature_map'", "a known feature-map spec", e.what());
  }
}

/// "per layer    0: inline:identity@code, ..." where the layers differ in family, else nothing.
std::string per_layer_variants(const DumpSchema& s) {
  return s.variants_differ() ? "per layer   " + s.layer_variants_text() + "\n" : "";
}

/// "geometry    0: 2 heads x 8, 4 windows of 7x7 on 14x14" per layer where a layer's shape is
/// not the root attributes', else nothing.
std::string per_layer_geometry(const DumpSchema& s) {
  if (!s.geometry_differs()) return "";
  std::string out;
  for (int l = 0; l < s.attrs.num_layers; ++l) {
    out += (l ? "            " : "geometry    ") + std::to_string(s.model_layer(l)) + ": " +
           s.geometry(l).describe() + "\n";
  }
  return out;
}

std::string layers_with(const std::vector<bool>& has) {
  std::string out;
  int count = 0;
  for (std::size_t l = 0; l < has.size(); ++l) {
    if (!has[l]) continue;
    if (count++ > 0) out += ',';
    out += std::to_string(l);
  }
  if (count == 0) return "none";
  if (count == static_cast<int>(has.size())) return "all layers";
  return "layers " + out;
}

/// "model layers 2,0 in /layers/0.." when the dump holds a subset of the model's layers.
std::string source_layers_line(const DumpSchema& s) {
  if (s.source_layers.empty()) return "";
  std::string out = "source      model layers ";
  for (std::size_t l = 0; l < s.source_layers.size(); ++l) {
    out += (l ? "," : "") + std::to_string(s.source_layers[l]);
  }
  return out + " (source_layers: /layers/0, /layers/1, ... in this order)\n";
}

void print_schema(const DumpReader& r, std::ostream& os) {
  const DumpSchema& s = r.schema();
  const DumpAttributes& a = s.attrs;
  os << "file        " << s.path << " (" << std::filesystem::file_size(s.path) << " bytes)\n"
     << "format      attnscope-dump v" << a.format_version << "\n"
     << "model       " << a.model_name << "\n"
     << "variant     " << variant_name(s) << " (attention_family " << a.attention_family
     << ", feature_map " << a.feature_map << ", convention " << a.convention << ")\n"
     << per_layer_variants(s) << "scale       " << a.scale << "\n"
     << "shape       " << s.num_images << " images x " << a.num_layers << " layers x "
     << a.num_heads << " heads x " << a.num_tokens << " tokens x " << a.head_dim << " dims\n"
     << source_layers_line(s) << "tokens      " << a.num_tokens << " = " << a.grid.prefix
     << " prefix + " << a.grid.height << "x" << a.grid.width << " grid\n"
     << per_layer_geometry(s)
     << "dtype       " << (s.dtype == DType::F16 ? "float16" : "float32") << "\n"
     << "optional    attn: " << layers_with(s.layer_has_attn)
     << "; out: " << layers_with(s.layer_has_out) << "; local: " << layers_with(s.layer_has_local)
     << "; labels: " << (s.has_labels ? "yes" : "no")
     << "; logits: " << (s.has_logits ? "yes" : "no")
     << "; images: " << (s.has_images ? "yes" : "no") << "\n"
     << "datasets\n";
  for (const DatasetInfo& d : r.datasets()) {
    os << "  " << std::left << std::setw(18) << d.name << std::setw(22) << shape_text(d.shape)
       << std::setw(9) << d.dtype << "chunks " << std::setw(20)
       << (d.chunks.empty() ? std::string("none") : shape_text(d.chunks)) << "filters " << d.filters
       << "\n";
  }
}

/// The local terms' kernels (/layers/L/local_kernel, local_bias) of the layers that hold one on
/// the query grid, as `locality --fold-local` reads them: the first image of each file, or with
/// every_image each image (shapes, padding, finite values; InputError naming the first fault).
void check_local_kernels(const DumpSchema& s, bool every_image) {
  for (int l = 0; l < s.attrs.num_layers; ++l) {
    const LayerGeometry geo = s.geometry(l);
    if (geo.reduced()) continue;  // keys from a reduced grid: no kernel maps them (local_fold)
    for (std::size_t f = 0; f < s.files.size() && f < s.file_images.size(); ++f) {
      if (has_local_kernel(s.files[f], l)) {
        for (long i = 0; i < (every_image ? s.file_images[f] : 1L); ++i)
          (void)read_local_kernel(s.files[f], l, i, geo);
      }
    }
  }
}

/// Reads every value of the dump (each read checks finiteness and throws at the first NaN/Inf),
/// images streamed by the analyses' loop with the model's own tensors.
void check_values(DumpReader& r) {
  const DumpSchema& s = r.schema();
  Progress progress("info", static_cast<std::size_t>(s.num_images));
  analyses::Selection every = analyses::resolve(s, {});
  every.need_model_tensors = true;
  every.any_geometry = true;  // only reads: every layer in its own shape
  analyses::for_each_head(
      r, every, [](const analyses::HeadView&) {}, [&](int) { progress.tick(); });
  progress.finish();
  for (int l = 0; l < s.attrs.num_layers; ++l) {  // the local terms (not read by the loop)
    if (!s.layer_has_local[static_cast<std::size_t>(l)]) continue;
    for (int i = 0; i < s.num_images; ++i)
      for (int h = 0; h < s.geometry(l).num_heads; ++h) (void)r.read_local(i, l, h);
  }
  check_local_kernels(s, true);
  (void)r.read_logits();
  (void)r.read_images(nullptr);
}

std::string join_views(const std::vector<std::string_view>& names) {
  std::string out;
  for (std::string_view n : names) out.append(out.empty() ? "" : ", ").append(n);
  return out;
}

/// The family registry, one block per family: its spec, what it takes, its weight formula.
void print_families() {
  for (const AttentionFamily* f : all_families()) {
    const char* map = f->map_rule() == MapRule::None       ? "none"
                      : f->map_rule() == MapRule::Required ? "required"
                                                           : "default ";
    std::cout << f->name() << "\n  feature map  " << map
              << (f->map_rule() == MapRule::Defaulted ? std::string(f->default_map())
                                                      : std::string())
              << "\n  form         "
              << (f->form() == Form::Kernel ? "kernel (linear-time outputs, low-rank W = Z M)"
                                            : "scores")
              << "\n  weights      " << f->formula() << "\n";
    const std::vector<std::string_view> parts = f->parts();
    if (!parts.empty())
      std::cout << "  maps         " << join_views(parts) << " (the spec's map slot picks one)\n";
    const std::vector<std::string_view> params =
        f->params(parse_variant(example_spec(*f), Convention::Code));
    if (!params.empty())
      std::cout << "  layer data   " << join_views(params) << " (docs/dump-format.md)\n";
    if (const auto moved = f->convention_family(Convention::CodeRope)) {
      std::cout << "  code+rope    computed by " << moved->first->name() << "@"
                << to_string(moved->second) << "\n";
    }
  }
}

int run_info(const std::vector<std::string>& args) {
  std::string file;
  bool values = false, families = false;
  po::options_description desc("options");
  auto add = desc.add_options();
  add("file", po::value(&file)->value_name("FILE"),
      "dump to describe (also accepted as the first positional argument)");
  add("check-values", po::bool_switch(&values),
      "read every image and check that all values are finite");
  add("families", po::bool_switch(&families),
      "list the attention families of this build (no FILE): spec name, feature map, form, weights");
  po::positional_options_description pos;
  pos.add("file", 1);
  po::variables_map vm;
  if (!parse_args("info", "FILE [--check-values] | --families", desc, args, vm, &pos)) return 0;
  if (families) {
    if (!file.empty() || values) throw UsageError("--families takes no FILE and no --check-values");
    print_families();
    return 0;
  }
  if (file.empty()) throw UsageError("the option '--file' is required but missing");
  if (values) (void)apply_threads(0);  // OMP_NUM_THREADS checked as by every image run
  DumpReader reader(file);
  if (reader.schema().num_images == 0) {
    throw InputError(file, "/layers/0/q", "at least one image", "no images");
  }
  // What every analysis checks before its first image: the family data the layers' own
  // families need, and the local terms' kernels.
  analyses::check_family_data(reader.schema());
  check_local_kernels(reader.schema(), false);
  // The whole description is built first: a failure half-way prints nothing on stdout.
  std::ostringstream text;
  print_schema(reader, text);
  std::cout << text.str() << "schema      valid\n" << std::flush;
  if (values) {
    check_values(reader);
    std::cout << "values      all finite (" << reader.schema().num_images << " images read)\n";
  }
  return 0;
}

const CommandRegistration kInfo({"info",
                                 "print and validate a dump's schema (--check-values: "
                                 "read every value)",
                                 run_info});

}  // namespace
}  // namespace attnscope::app
