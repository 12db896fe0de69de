// attnscope replay: a ViT forward pass in C++ on the images of a dump, with interventions inside
// the attention layers; accuracy per intervention and the logits of every image (replay.hpp).
#include "command.hpp"
#include "common.hpp"
#include "attnscope/run/image_run.hpp"

#include "attnscope/analyses/replay.hpp"
#include "attnscope/dump.hpp"
#include "attnscope/text.hpp"
#include "attnscope/vit.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

namespace attnscope::app {
namespace {

struct ReplayFlags {
  CommonOptions common;
  std::string models, image_set, images, layers, interventions = "none", attention = "double";
  RunControl control;
};

po::options_description replay_options(ReplayFlags& f) {
  po::options_description d("options");
  d.add_options()("model", po::value(&f.models)->value_name("FILE[,FILE...]")->required(),
                  "model weights (HDF5, docs/model-weights.md); several, comma-separated, run on "
                  "the same images give one column each");
  add_dump_option(d, f.common, "--image-set", false);
  d.add_options()("image-set", po::value(&f.image_set)->value_name("FILE"),
                  "instead of a dump: an HDF5 file with /images [n, C, H, W] and optional /labels");
  add_out_option(d, f.common, "results/replay");
  d.add_options()("images", po::value(&f.images)->value_name("LIST"),
                  "images of the dump's /images, e.g. 0-9,15 (default: all)")(
      "layers", po::value(&f.layers)->value_name("LIST"),
      "blocks the interventions apply to, e.g. 0,3 (default: all)")(
      "intervention", po::value(&f.interventions)->value_name("LIST")->default_value(f.interventions),
      "comma list: none, local:K, random:N, f1, f2, l2norm, family=SPEC")(
      "attention", po::value(&f.attention)->value_name("MODE")->default_value(f.attention),
      "precision of the softmax heads: double (the library's bits, default) or float (PyTorch's "
      "precision, faster; masked heads and kernel families stay in double)");
  add_threads_option(d, f.common);
  add_device_option(d, f.common);
  add_seed_option(d, f.common);
  add_run_control_options(d, f.control);
  return d;
}

/// The images the models run on: the rows of the dump's (or image set's) /images named by
/// --images (all by default), read one at a time as they are needed.
struct Inputs {
  std::unique_ptr<ImageRowReader> rows;
  std::vector<int> ids;
  std::vector<int> shape;  ///< C, H, W
  std::vector<std::int64_t> labels;  ///< of every image of the file (empty without)
  bool has_logits = false;  ///< the dump holds its own model's logits
  std::string model_name;
};

Inputs open_inputs(const ReplayFlags& f) {
  Inputs in;
  std::string path = f.image_set;
  if (f.common.dump.size() > 1) {
    throw UsageError("replay reads the images of one dump: give one --dump file (or --image-set)");
  }
  if (path.empty()) {
    DumpReader reader(f.common.dump);
    const DumpSchema& schema = reader.schema();
    if (!schema.has_images) throw InputError(schema.path, "/images", "the model's input images", "none");
    in.has_logits = schema.has_logits;
    in.model_name = schema.attrs.model_name;
    path = f.common.dump.front();
  }
  in.rows = std::make_unique<ImageRowReader>(path);
  in.shape = in.rows->shape();
  in.labels = in.rows->labels();
  in.ids = analyses::parse_index_list(f.images, "--images");
  if (in.ids.empty()) {
    for (int i = 0; i < in.rows->count(); ++i) in.ids.push_back(i);
  }
  for (int id : in.ids) {
    if (id < 0 || id >= in.rows->count()) {
      throw UsageError("--images: the dump holds " + std::to_string(in.rows->count()) + " images, found " +
                       std::to_string(id));
    }
  }
  return in;
}

void check_fit(const VitModel& m, const Inputs& in, const std::string& dump) {
  const std::vector<int> expected{m.in_chans, m.image_size, m.image_size};
  if (in.shape != expected) {
    throw InputError(dump, "/images",
                     "images of " + std::to_string(expected[0]) + " x " + std::to_string(expected[1]) + " x " +
                         std::to_string(expected[2]) + " for " + m.model_name,
                     std::to_string(in.shape[0]) + " x " + std::to_string(in.shape[1]) + " x " +
                         std::to_string(in.shape[2]));
  }
  for (std::int64_t label : in.labels) {
    if (label < 0 || label >= m.num_classes) {
      throw InputError(dump, "/labels", "labels below " + m.model_name + "'s " + std::to_string(m.num_classes) +
                                            " classes", std::to_string(label));
    }
  }
}

struct Row {
  std::string model, intervention;
  int correct = 0;
  int agree_count = 0;
  double accuracy = -1.0;  ///< -1 without labels
  double agree = 0.0;
  double dump_error = -1.0;  ///< vs the dump's logits (-1: not comparable)
};

/// Images replayed per batch (at least two per thread): few enough to hold, whatever the run's size.
constexpr std::size_t kBatch = 32;

int run_replay_cmd(const std::vector<std::string>& args) {
  ReplayFlags f;
  const po::options_description desc = replay_options(f);
  po::variables_map vm;
  if (!parse_args("replay", "--model FILE[,FILE...] --dump FILE | --image-set FILE [options]", desc, args, vm)) return 0;
  const int threads = apply_threads(f.common.threads);
  const ResolvedDevice device = apply_device("replay", f.common, false);
  std::vector<VitModel> models;
  std::vector<std::string> model_paths;
  for (const std::string_view path : split_list(f.models)) {
    if (path.empty()) throw UsageError("--model: an empty item in '" + f.models + "'");
    models.push_back(load_vit(std::string(path)));
    model_paths.emplace_back(path);
    // Rows and columns are labelled by model name: two models of one name could not be told apart.
    for (std::size_t k = 0; k + 1 < models.size(); ++k) {
      if (models[k].model_name == models.back().model_name) {
        throw UsageError("--model: '" + std::string(path) + "' is model '" + models.back().model_name +
                         "', as '" + model_paths[k] + "' is: its rows could not be told apart; name each model once");
      }
    }
  }
  analyses::ReplayOptions opt;
  opt.seed = f.common.seed;
  opt.layers = analyses::parse_index_list(f.layers, "--layers");
  if (f.attention != "double" && f.attention != "float") {
    throw UsageError("--attention: expected double or float, got '" + f.attention + "'");
  }
  opt.float_attention = f.attention == "float";
  std::vector<std::vector<analyses::Intervention>> ivs;
  for (const VitModel& m : models) ivs.push_back(analyses::parse_interventions(f.interventions, m, f.common.seed));
  if (f.common.dump.empty() == f.image_set.empty()) throw UsageError("give either --dump or --image-set");
  Inputs in = open_inputs(f);
  const std::string source = f.image_set.empty() ? f.common.dump.name() : f.image_set;
  for (const VitModel& m : models) check_fit(m, in, source);
  const std::filesystem::path dir = ensure_out_dir(f.common.out);
  const std::size_t per = ivs.front().size();
  // Per model, the intervention whose logits are compared with the dump's own (-1: none): the
  // dump's model itself, unchanged.
  std::vector<int> own(models.size(), -1);
  for (std::size_t k = 0; k < models.size(); ++k) {
    for (std::size_t j = 0; j < per; ++j) {
      if (ivs[k][j].name == "none" && in.has_logits && in.model_name == models[k].model_name &&
          in.rows->logit_classes() == models[k].num_classes) {
        own[k] = static_cast<int>(j);
      }
    }
  }

  RunMetadata meta("replay");
  nlohmann::json model_files = nlohmann::json::array(), names = nlohmann::json::array(), ivnames = nlohmann::json::array();
  for (const VitModel& m : models) model_files.push_back(m.path), names.push_back(m.model_name);
  for (const auto& iv : ivs.front()) ivnames.push_back(iv.name);
  meta.inputs() = {{"models", model_files}, {"images", source}};
  meta.params() = {{"models", names}, {"interventions", ivnames}, {"images", in.ids.size()},
                   {"layers", opt.layers}, {"seed", f.common.seed}, {"threads", threads},
                   {"attention", f.attention}};
  meta.params()["device"] = device.description;
  std::vector<std::string> inputs{source};
  inputs.insert(inputs.end(), model_paths.begin(), model_paths.end());
  ImageRun run(f.control, "replay", command_args(args), dir, run_fingerprint("replay", inputs, meta.params()), in.ids);

  // An image's record: its label (-1 without labels) and, per model, the predicted class and the
  // logits under each intervention, and where the dump holds the model's own logits, the largest
  // difference from them and their largest magnitude.
  run.compute([&] {
    // Each model's weights laid out for the forward pass once, not once per batch.
    std::vector<analyses::ReplayModel> prepared;
    for (const VitModel& m : models) prepared.emplace_back(m);
    const std::vector<int>& todo = run.pending();
    Progress progress("replay", todo.size());
    const Eigen::Index pixels = static_cast<Eigen::Index>(in.shape[0]) * in.shape[1] * in.shape[2];
    const std::size_t batch = std::max(kBatch, 2 * static_cast<std::size_t>(std::max(threads, 1)));
    for (std::size_t b = 0; b < todo.size(); b += batch) {
      const std::vector<int> ids(todo.begin() + static_cast<std::ptrdiff_t>(b),
                                 todo.begin() + static_cast<std::ptrdiff_t>(std::min(todo.size(), b + batch)));
      MatF images(static_cast<Eigen::Index>(ids.size()), pixels);
      for (std::size_t i = 0; i < ids.size(); ++i) {
        images.row(static_cast<Eigen::Index>(i)) = in.rows->image(ids[i]).transpose();
      }
      std::vector<std::vector<MatF>> logits(models.size());
      for (std::size_t k = 0; k < models.size(); ++k) {
        for (const auto& iv : ivs[k]) logits[k].push_back(analyses::replay_logits(prepared[k], images, ids, iv, opt));
      }
      for (std::size_t i = 0; i < ids.size(); ++i) {
        const auto r = static_cast<Eigen::Index>(i);
        nlohmann::json per_model = nlohmann::json::array();
        for (std::size_t k = 0; k < models.size(); ++k) {
          nlohmann::json predicted = nlohmann::json::array(), rows = nlohmann::json::array();
          for (const MatF& l : logits[k]) {
            Eigen::Index arg = 0;
            l.row(r).maxCoeff(&arg);
            predicted.push_back(static_cast<int>(arg));
            rows.push_back(std::vector<float>(l.row(r).data(), l.row(r).data() + l.cols()));
          }
          nlohmann::json m = {{"predicted", std::move(predicted)}, {"logits", std::move(rows)}};
          if (own[k] >= 0) {
            const VecD want = in.rows->logits(ids[i]).cast<double>();
            const auto got = logits[k][static_cast<std::size_t>(own[k])].row(r).cast<double>();
            // Eigen's maxCoeff and std::max drop a NaN: a comparison that meets one is an error,
            // never a difference of 0.
            const VecD diff = (got.transpose() - want).cwiseAbs();
            if (!diff.allFinite()) {
              throw NumericalError("image " + std::to_string(ids[i]) + ": the logits of " + models[k].path +
                                   " cannot be compared with the dump's (NaN or Inf)");
            }
            m["own"] = {diff.maxCoeff(), want.cwiseAbs().maxCoeff()};
          }
          per_model.push_back(std::move(m));
        }
        const std::int64_t label = in.labels.empty() ? -1 : in.labels[static_cast<std::size_t>(ids[i])];
        run.record(ids[i], {{"label", label}, {"models", std::move(per_model)}});
        progress.tick();
      }
    }
    progress.finish();
  });

  std::vector<Row> rows;
  for (std::size_t k = 0; k < models.size(); ++k) {
    for (const auto& iv : ivs[k]) rows.push_back(Row{models[k].model_name, iv.name});
  }
  std::vector<double> worst(models.size(), 0.0), top(models.size(), 0.0);
  // replay_logits.csv lists model by model, intervention by intervention: each (model,
  // intervention) block is written to a part file of the staging folder as images come, and the
  // parts are joined when the run publishes.
  std::unique_ptr<ResultSet> set;
  std::vector<std::filesystem::path> part_paths;
  std::vector<std::unique_ptr<ResultFile>> parts;
  auto open_set = [&] {
    if (set) return;
    set = std::make_unique<ResultSet>(dir, "replay.json");
    for (std::size_t p = 0; p < rows.size(); ++p) {
      // Errors name replay_logits.csv as published, with the reason (not the staging part).
      const std::string name = "replay_logits.part-" + std::to_string(p);
      part_paths.push_back(set->staging() / name);
      parts.push_back(set->part_of("replay_logits.csv", name));
      parts.back()->stream() << std::setprecision(9);
    }
  };
  auto apply = [&](int image, const nlohmann::json& rec) {
    open_set();
    const auto bad = [image] { return Error("replay: a malformed record of image " + std::to_string(image)); };
    const std::int64_t label = rec.at("label").get<std::int64_t>();
    const nlohmann::json& per_model = rec.at("models");
    if (per_model.size() != models.size()) throw bad();
    for (std::size_t k = 0; k < models.size(); ++k) {
      const nlohmann::json& m = per_model[k];
      const auto predicted = m.at("predicted").get<std::vector<int>>();
      const nlohmann::json& logits = m.at("logits");
      if (predicted.size() != per || logits.size() != per) throw bad();
      for (std::size_t j = 0; j < per; ++j) {
        Row& row = rows[k * per + j];
        row.correct += label == predicted[j] ? 1 : 0;
        row.agree_count += predicted[j] == predicted[0] ? 1 : 0;
        std::ostream& out = parts[k * per + j]->stream();
        out << row.model << "," << row.intervention << "," << image << "," << label << "," << predicted[j] << ",";
        const auto values = logits[j].get<std::vector<float>>();
        for (std::size_t c = 0; c < values.size(); ++c) out << (c ? " " : "") << values[c];
        out << "\n";
      }
      if (own[k] >= 0) {
        worst[k] = std::max(worst[k], m.at("own").at(0).get<double>());
        top[k] = std::max(top[k], m.at("own").at(1).get<double>());
      }
    }
  };
  auto publish = [&] {
    open_set();
    ResultFile logits_csv(*set, "replay_logits.csv");
    const std::filesystem::path logits_path = set->final_path("replay_logits.csv");
    logits_csv.stream() << "model,intervention,image,label,predicted,logits\n";
    for (std::size_t p = 0; p < parts.size(); ++p) {
      parts[p]->close();  // throws "<out>/replay_logits.csv: cannot write: <reason>"
      std::ifstream part(part_paths[p], std::ios::binary);
      if (!part) throw Error(logits_path.string() + ": cannot read back its part: " + std::strerror(errno));
      if (part.peek() != std::ifstream::traits_type::eof()) logits_csv.stream() << part.rdbuf();
      part.close();
      std::filesystem::remove(part_paths[p]);
    }
    logits_csv.close();
    const double n = static_cast<double>(in.ids.size());
    for (std::size_t k = 0; k < models.size(); ++k) {
      for (std::size_t j = 0; j < per; ++j) {
        Row& row = rows[k * per + j];
        row.agree = row.agree_count / n;
        if (!in.labels.empty()) row.accuracy = row.correct / n;
        if (own[k] == static_cast<int>(j)) row.dump_error = top[k] > 0.0 ? worst[k] / top[k] : worst[k];
      }
    }
    ResultFile table(*set, "replay.csv");
    table.stream() << "model,intervention,images,correct,accuracy,agree_with_first,dump_logits_max_rel_error\n"
                   << std::setprecision(17);
    nlohmann::json jrows = nlohmann::json::array();
    for (const Row& r : rows) {
      table.stream() << r.model << "," << r.intervention << "," << in.ids.size() << ","
                     << (r.accuracy < 0 ? "" : std::to_string(r.correct)) << ",";
      if (r.accuracy >= 0) table.stream() << r.accuracy;
      table.stream() << "," << r.agree << ",";
      if (r.dump_error >= 0) table.stream() << r.dump_error;
      table.stream() << "\n";
      nlohmann::json j = {{"model", r.model}, {"intervention", r.intervention}, {"images", in.ids.size()},
                          {"accuracy", r.accuracy < 0 ? nlohmann::json() : nlohmann::json(r.accuracy)},
                          {"agree_with_first", r.agree}};
      if (r.dump_error >= 0) j["dump_logits_max_rel_error"] = r.dump_error;
      jrows.push_back(j);
    }
    table.close();
    meta.results() = {{"rows", jrows}};
    meta.publish(*set);
  };
  if (!run.finish(apply, publish)) return 0;

  // One table: a row per intervention, a column per model (accuracy %, or agreement without labels).
  std::cout << (in.labels.empty() ? "agreement with the first intervention" : "accuracy (%)") << " on "
            << in.ids.size() << " images\n" << std::left << std::setw(22) << "intervention";
  for (const VitModel& m : models) std::cout << std::setw(26) << m.model_name;
  std::cout << "\n";
  for (std::size_t i = 0; i < per; ++i) {
    std::cout << std::setw(22) << rows[i].intervention;
    for (std::size_t k = 0; k < models.size(); ++k) {
      const Row& r = rows[k * per + i];
      std::ostringstream cell;
      cell << std::fixed << std::setprecision(2) << 100.0 * (r.accuracy < 0 ? r.agree : r.accuracy);
      std::cout << std::setw(26) << cell.str();
    }
    std::cout << "\n";
  }
  for (const Row& r : rows) {
    if (r.dump_error >= 0) {
      std::cout << r.model << ": logits vs the dump's own, max rel. error " << r.dump_error << "\n";
    }
  }
  return 0;
}

const CommandRegistration kRegistration{
    {"replay", "run a model's forward pass in C++ on a dump's images, with interventions inside its "
               "attention (masks, query maps, a family swap): accuracy and logits",
     run_replay_cmd, true}};

}  // namespace
}  // namespace attnscope::app
