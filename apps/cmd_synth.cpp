// attnscope synth: writes a synthetic dump with planted structure
// (lib/include/attnscope/synth.hpp).
#include "command.hpp"
#include "common.hpp"

#include "attnscope/error.hpp"
#include "attnscope/synth.hpp"

#include <iomanip>
#include <memory>
#include <iostream>
#include <sstream>

namespace attnscope::app {
namespace {

DType parse_dtype(const std::string& s) {
  if (s == "f32" || s == "float32") return DType::F32;
  if (s == "f16" || s == "float16") return DType::F16;
  throw UsageError("--dtype must be f32 or f16, got '" + s + "'");
}

void add_synth_options(po::options_description& d, SynthOptions& o, std::string& out,
                       std::string& dtype) {
  auto add = d.add_options();
  add("out", po::value(&out)->value_name("FILE.h5")->required(),
      "dump FILE to write (a file, not a folder); run metadata goes to FILE.h5.json");
  add("layers", po::value(&o.layers)->value_name("L")->default_value(o.layers), "layers");
  add("heads", po::value(&o.heads)->value_name("H")->default_value(o.heads), "heads per layer");
  add("grid-height", po::value(&o.grid.height)->value_name("N")->default_value(o.grid.height),
      "patch grid rows");
  add("grid-width", po::value(&o.grid.width)->value_name("N")->default_value(o.grid.width),
      "patch grid columns");
  add("prefix", po::value(&o.grid.prefix)->value_name("N")->default_value(o.grid.prefix),
      "prefix tokens before the grid (1 = CLS)");
  add("head-dim", po::value(&o.head_dim)->value_name("D")->default_value(o.head_dim), "head dim");
  add("images", po::value(&o.images)->value_name("N")->default_value(o.images), "images");
  add("dtype", po::value(&dtype)->value_name("f32|f16")->default_value(dtype), "stored dtype");
  add("compression", po::value(&o.compression)->value_name("0-9")->default_value(o.compression),
      "gzip level (0: none)");
  add("model-name", po::value(&o.model_name)->value_name("NAME")->default_value(o.model_name),
      "model_name attribute");
  add("family", po::value(&o.family)->value_name("F")->default_value(o.family),
      "attention_family attribute: a family of `attnscope info --families`");
  add("convention", po::value(&o.convention)->value_name("C")->default_value(o.convention),
      "convention attribute: paper, code or code+rope");
  add("feature-map", po::value(&o.feature_map)->value_name("MAP")->default_value(o.feature_map),
      "feature_map attribute (none for softmax)");
  add("plant-duplicates", po::value(&o.plant_duplicates)->value_name("N")->default_value(0),
      "query pairs with q_j = q_i, per image, layer and head");
  add("plant-collinear", po::value(&o.plant_collinear)->value_name("N")->default_value(0),
      "query pairs with q_j = c q_i, c in {1/2, 2}, per image, layer and head");
  add("plant-shifted", po::value(&o.plant_shifted)->value_name("N")->default_value(0),
      "query pairs with q_j = q_i + t x where K x = 1 (needs --plant-hyperplane)");
  add("plant-hyperplane", po::bool_switch(&o.plant_hyperplane),
      "put every key of a head on a hyperplane k . x = 1 (rank([K, 1]) = d)");
}

std::string human_bytes(std::uintmax_t b) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1);
  if (b >= (1U << 20)) {
    os << static_cast<double>(b) / (1 << 20) << " MiB";
  } else {
    os << static_cast<double>(b) / (1 << 10) << " KiB";
  }
  return os.str();
}

nlohmann::json options_json(const SynthOptions& o, const std::string& dtype) {
  return {{"layers", o.layers},
          {"heads", o.heads},
          {"grid_height", o.grid.height},
          {"grid_width", o.grid.width},
          {"prefix", o.grid.prefix},
          {"head_dim", o.head_dim},
          {"images", o.images},
          {"dtype", dtype},
          {"compression", o.compression},
          {"seed", o.seed},
          {"model_name", o.model_name},
          {"family", o.family},
          {"convention", o.convention},
          {"feature_map", o.feature_map},
          {"plant_duplicates", o.plant_duplicates},
          {"plant_collinear", o.plant_collinear},
          {"plant_shifted", o.plant_shifted},
          {"plant_hyperplane", o.plant_hyperplane}};
}

int run_synth(const std::vector<std::string>& args) {
  SynthOptions o;
  CommonOptions common;
  std::string out, dtype = "f32";
  po::options_description desc("options");
  add_synth_options(desc, o, out, dtype);
  add_seed_option(desc, common);
  add_threads_option(desc, common);
  po::variables_map vm;
  if (!parse_args("synth", "--out FILE.h5 [options]", desc, args, vm)) return 0;
  o.seed = common.seed;
  o.dtype = parse_dtype(dtype);
  const int threads = apply_threads(common.threads);
  o.validate();

  // The dump and FILE.h5.json form the run's result set, published in the dump's folder.
  const std::filesystem::path out_path(out);
  const std::string name = out_path.filename().string();
  if (name.empty() || name == "." || name == "..") {
    throw UsageError("--out must name a file, got '" + out + "'");
  }
  RunMetadata meta("synth");
  meta.params() = options_json(o, dtype);
  std::unique_ptr<ResultSet> made;
  try {
    made = std::make_unique<ResultSet>(out_path.parent_path(), name + ".json");
  } catch (const Error& e) {
    throw Error(out + ": cannot write the dump: " + e.what());  // name the file asked for
  }
  ResultSet& set = *made;
  const std::filesystem::path staged = set.stage(name);
  Progress progress("synth", static_cast<std::size_t>(o.images));
  try {
    write_synth_dump(staged.string(), o, [&](int) { progress.tick(); });
  } catch (...) {
    set.rethrow_with_final_names();
  }
  progress.finish();

  const std::uintmax_t bytes = std::filesystem::file_size(staged);
  meta.results() = {{"dump", out}, {"bytes", bytes}, {"num_tokens", o.tokens()}};
  meta.params()["threads"] = threads;
  meta.publish(set);
  std::cout << "wrote " << out << ": " << o.images << " images, " << o.layers << " layers x "
            << o.heads << " heads, " << o.tokens() << " tokens (" << o.grid.prefix << " + "
            << o.grid.height << "x" << o.grid.width << "), head dim " << o.head_dim << ", "
            << (o.dtype == DType::F16 ? "float16" : "float32") << ", " << human_bytes(bytes)
            << "\n";
  return 0;
}

const CommandRegistration kSynth({"synth", "write a synthetic dump with planted structure",
                                  run_synth});

}  // namespace
}  // namespace attnscope::app
