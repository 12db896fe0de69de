// attnscope replay: a ViT forward pass in C++ on the images of a dump, with interventions inside
// the attention layers; accuracy per intervention and the logits of every image (replay.hpp).
#include "command.hpp"
#include "common.hpp"

#include "attnscope/analyses/replay.hpp"
#include "attnscope/dump.hpp"
#include "attnscope/text.hpp"
#include "attnscope/vit.hpp"

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <sstream>

namespace attnscope::app {
namespace {

struct ReplayFlags {
  CommonOptions common;
  std::string models, image_set, images, layers, interventions = "none";
};

po::options_description replay_options(ReplayFlags& f) {
  po::options_description d("options");
  d.add_options()("model", po::value(&f.models)->value_name("FILE[,FILE...]")->required(),
                  "model weights (HDF5, docs/model-weights.md); several, comma-separated, run on "
                  "the same images give one column each");
  add_dump_option(d, f.common, "--image-set");
  d.add_options()("image-set", po::value(&f.image_set)->value_name("FILE"),
                  "instead of a dump: an HDF5 file with /images [n, C, H, W] and optional /labels");
  add_out_option(d, f.common, "results/replay");
  d.add_options()("images", po::value(&f.images)->value_name("LIST"),
                  "images of the dump's /images, e.g. 0-9,15 (default: all)")(
      "layers", po::value(&f.layers)->value_name("LIST"),
      "blocks the interventions apply to, e.g. 0,3 (default: all)")(
      "intervention", po::value(&f.interventions)->value_name("LIST")->default_value(f.interventions),
      "comma list: none, local:K, random:N, f1, f2, l2norm, family=SPEC");
  add_threads_option(d, f.common);
  add_device_option(d, f.common);
  add_seed_option(d, f.common);
  return d;
}

/// The images the models run on: the dump's /images rows named by --images (all by default).
struct Inputs {
  std::vector<int> ids;
  MatF images;
  std::vector<int> shape;  ///< C, H, W
  std::vector<std::int64_t> labels;
  MatF logits;  ///< the dump's own model's logits, when it has them
  std::string model_name;
};

Inputs read_inputs(const ReplayFlags& f) {
  Inputs in;
  MatF all;
  if (!f.image_set.empty()) {
    ImageSet set = read_image_set(f.image_set);
    all = std::move(set.images);
    in.shape = set.shape;
    in.labels = std::move(set.labels);
  } else {
    DumpReader reader(f.common.dump);
    const DumpSchema& schema = reader.schema();
    if (!schema.has_images) throw InputError(f.common.dump, "/images", "the model's input images", "none");
    all = reader.read_images(&in.shape);
    if (schema.has_labels) in.labels = reader.read_labels();
    if (schema.has_logits) in.logits = reader.read_logits();
    in.model_name = schema.attrs.model_name;
  }
  in.ids = analyses::parse_index_list(f.images, "--images");
  if (in.ids.empty()) {
    for (Eigen::Index i = 0; i < all.rows(); ++i) in.ids.push_back(static_cast<int>(i));
  }
  in.images.resize(static_cast<Eigen::Index>(in.ids.size()), all.cols());
  for (std::size_t i = 0; i < in.ids.size(); ++i) {
    if (in.ids[i] < 0 || in.ids[i] >= all.rows()) {
      throw UsageError("--images: the dump holds " + std::to_string(all.rows()) + " images, found " +
                       std::to_string(in.ids[i]));
    }
    in.images.row(static_cast<Eigen::Index>(i)) = all.row(in.ids[i]);
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
  double accuracy = -1.0;  ///< -1 without labels
  double agree = 0.0;
  double dump_error = -1.0;  ///< vs the dump's logits (-1: not comparable)
};

int run_replay_cmd(const std::vector<std::string>& args) {
  ReplayFlags f;
  const po::options_description desc = replay_options(f);
  po::variables_map vm;
  if (!parse_args("replay", "--model FILE[,FILE...] --dump FILE | --image-set FILE [options]", desc, args, vm)) return 0;
  const int threads = apply_threads(f.common.threads);
  const ResolvedDevice device = apply_device("replay", f.common, false);
  std::vector<VitModel> models;
  for (const std::string_view path : split_list(f.models)) {
    if (path.empty()) throw UsageError("--model: an empty item in '" + f.models + "'");
    models.push_back(load_vit(std::string(path)));
  }
  analyses::ReplayOptions opt;
  opt.seed = f.common.seed;
  opt.layers = analyses::parse_index_list(f.layers, "--layers");
  std::vector<std::vector<analyses::Intervention>> ivs;
  for (const VitModel& m : models) ivs.push_back(analyses::parse_interventions(f.interventions, m, f.common.seed));
  if (f.common.dump.empty() == f.image_set.empty()) throw UsageError("give either --dump or --image-set");
  const Inputs in = read_inputs(f);
  const std::string source = f.image_set.empty() ? f.common.dump : f.image_set;
  for (const VitModel& m : models) check_fit(m, in, source);
  const std::filesystem::path dir = ensure_out_dir(f.common.out);

  ResultSet set(dir, "replay.json");
  RunMetadata meta("replay");
  nlohmann::json model_files = nlohmann::json::array(), names = nlohmann::json::array(), ivnames = nlohmann::json::array();
  for (const VitModel& m : models) model_files.push_back(m.path), names.push_back(m.model_name);
  for (const auto& iv : ivs.front()) ivnames.push_back(iv.name);
  meta.inputs() = {{"models", model_files}, {"images", source}};
  meta.params() = {{"models", names}, {"interventions", ivnames}, {"images", in.ids.size()},
                   {"layers", opt.layers}, {"seed", f.common.seed}, {"threads", threads}};
  meta.params()["device"] = device.description;
  ResultFile logits_csv(set, "replay_logits.csv");
  logits_csv.stream() << "model,intervention,image,label,predicted,logits\n" << std::setprecision(9);
  std::vector<Row> rows;
  const double n = static_cast<double>(in.ids.size());
  for (std::size_t k = 0; k < models.size(); ++k) {
    const VitModel& m = models[k];
    std::vector<int> first;
    for (const auto& iv : ivs[k]) {
      const MatF logits = analyses::replay_logits(m, in.images, in.ids, iv, opt);
      Row row{m.model_name, iv.name};
      std::vector<int> pred(in.ids.size());
      double worst = 0.0, top = 0.0;
      const bool own = iv.name == "none" && in.model_name == m.model_name && in.logits.cols() == m.num_classes;
      for (std::size_t i = 0; i < in.ids.size(); ++i) {
        const auto r = static_cast<Eigen::Index>(i);
        Eigen::Index arg = 0;
        logits.row(r).maxCoeff(&arg);
        pred[i] = static_cast<int>(arg);
        const std::int64_t label = in.labels.empty() ? -1 : in.labels[static_cast<std::size_t>(in.ids[i])];
        row.correct += label == pred[i] ? 1 : 0;
        logits_csv.stream() << m.model_name << "," << iv.name << "," << in.ids[i] << "," << label << "," << pred[i] << ",";
        for (int c = 0; c < m.num_classes; ++c) logits_csv.stream() << (c ? " " : "") << logits(r, c);
        logits_csv.stream() << "\n";
        if (own) {
          const auto want = in.logits.row(in.ids[i]).cast<double>();
          worst = std::max(worst, (logits.row(r).cast<double>() - want).cwiseAbs().maxCoeff());
          top = std::max(top, want.cwiseAbs().maxCoeff());
        }
      }
      if (first.empty()) first = pred;
      int agree = 0;
      for (std::size_t i = 0; i < pred.size(); ++i) agree += pred[i] == first[i] ? 1 : 0;
      row.agree = agree / n;
      if (!in.labels.empty()) row.accuracy = row.correct / n;
      if (own) row.dump_error = top > 0.0 ? worst / top : worst;
      rows.push_back(row);
    }
  }
  logits_csv.close();
  ResultFile table(set, "replay.csv");
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
  meta.publish(set);

  // One table: a row per intervention, a column per model (accuracy %, or agreement without labels).
  std::cout << (in.labels.empty() ? "agreement with the first intervention" : "accuracy (%)") << " on "
            << in.ids.size() << " images\n" << std::left << std::setw(22) << "intervention";
  for (const VitModel& m : models) std::cout << std::setw(26) << m.model_name;
  std::cout << "\n";
  const std::size_t per = ivs.front().size();
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
     run_replay_cmd}};

}  // namespace
}  // namespace attnscope::app
