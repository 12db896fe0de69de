// attnscope replay: a ViT forward pass in C++ on the images of a dump, with interventions inside
// the attention layers; accuracy per intervention and the logits of every image (replay.hpp).
#include "command.hpp"
#include "common.hpp"

#include "attnscope/analyses/replay.hpp"
#include "attnscope/dump.hpp"
#include "attnscope/vit.hpp"

#include <algorithm>
#include <iomanip>
#include <iostream>

namespace attnscope::app {
namespace {

struct ReplayFlags {
  CommonOptions common;
  std::string model, images, layers, interventions = "none";
};

po::options_description replay_options(ReplayFlags& f) {
  po::options_description d("options");
  d.add_options()("model", po::value(&f.model)->value_name("FILE")->required(),
                  "model weights (HDF5, docs/model-weights.md)");
  add_dump_option(d, f.common);
  add_out_option(d, f.common, "results/replay");
  d.add_options()("images", po::value(&f.images)->value_name("LIST"),
                  "images of the dump's /images, e.g. 0-9,15 (default: all)")(
      "layers", po::value(&f.layers)->value_name("LIST"),
      "blocks the interventions apply to, e.g. 0,3 (default: all)")(
      "intervention", po::value(&f.interventions)->value_name("LIST")->default_value(f.interventions),
      "comma list: none, local:K, random:N, f1, f2, l2norm, family=SPEC");
  add_threads_option(d, f.common);
  add_seed_option(d, f.common);
  return d;
}

int run_replay_cmd(const std::vector<std::string>& args) {
  ReplayFlags f;
  const po::options_description desc = replay_options(f);
  po::variables_map vm;
  if (!parse_args("replay", "--model FILE --dump FILE [options]", desc, args, vm)) return 0;
  const int threads = apply_threads(f.common.threads);
  const VitModel model = load_vit(f.model);
  const std::vector<analyses::Intervention> ivs = analyses::parse_interventions(f.interventions, model, f.common.seed);
  analyses::ReplayOptions opt;
  opt.seed = f.common.seed;
  opt.layers = analyses::parse_index_list(f.layers, "--layers");
  DumpReader reader(f.common.dump);
  if (!reader.schema().has_images) {
    throw InputError(f.common.dump, "/images", "the model's input images", "none");
  }
  std::vector<int> shape;
  const MatF all = reader.read_images(&shape);
  const std::vector<int> expected{model.in_chans, model.image_size, model.image_size};
  if (shape != expected) {
    throw InputError(f.common.dump, "/images",
                     "images of " + std::to_string(expected[0]) + " x " + std::to_string(expected[1]) + " x " +
                         std::to_string(expected[2]) + " for " + model.model_name,
                     std::to_string(shape[0]) + " x " + std::to_string(shape[1]) + " x " + std::to_string(shape[2]));
  }
  std::vector<int> ids = f.images.empty() ? std::vector<int>{} : analyses::parse_index_list(f.images, "--images");
  if (ids.empty()) {
    for (Eigen::Index i = 0; i < all.rows(); ++i) ids.push_back(static_cast<int>(i));
  }
  for (int i : ids) {
    if (i < 0 || i >= all.rows()) {
      throw UsageError("--images: the dump holds " + std::to_string(all.rows()) + " images, found " + std::to_string(i));
    }
  }
  MatF images(static_cast<Eigen::Index>(ids.size()), all.cols());
  for (std::size_t i = 0; i < ids.size(); ++i) images.row(static_cast<Eigen::Index>(i)) = all.row(ids[i]);
  const std::vector<std::int64_t> labels = reader.schema().has_labels ? reader.read_labels() : std::vector<std::int64_t>{};
  const MatF dump_logits = reader.schema().has_logits ? reader.read_logits() : MatF();
  const std::filesystem::path dir = ensure_out_dir(f.common.out);

  ResultSet set(dir, "replay.json");
  RunMetadata meta("replay");
  meta.inputs() = {{"model", f.model}, {"dump", f.common.dump}};
  nlohmann::json names = nlohmann::json::array();
  for (const auto& iv : ivs) names.push_back(iv.name);
  meta.params() = {{"model", model.model_name}, {"variant", model.variant.name()}, {"interventions", names},
                   {"images", ids.size()}, {"layers", opt.layers}, {"seed", f.common.seed},
                   {"precision", "double"}, {"threads", threads}};
  ResultFile logits_csv(set, "replay_logits.csv");
  logits_csv.stream() << "intervention,image,label,predicted";
  for (int c = 0; c < model.num_classes; ++c) logits_csv.stream() << ",logit_" << c;
  logits_csv.stream() << "\n" << std::setprecision(9);
  ResultFile table(set, "replay.csv");
  table.stream() << "intervention,images,correct,accuracy,agree_with_first\n" << std::setprecision(17);
  nlohmann::json rows = nlohmann::json::array();
  std::vector<int> first_pred;
  std::cout << "replay of " << model.model_name << " on " << ids.size() << " images\n"
            << std::left << std::setw(22) << "intervention" << std::setw(12) << "accuracy" << "agreement\n";
  for (const auto& iv : ivs) {
    const MatF logits = analyses::replay_logits(model, images, ids, iv, opt);
    std::vector<int> pred(ids.size());
    int correct = 0;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      Eigen::Index arg = 0;
      logits.row(static_cast<Eigen::Index>(i)).maxCoeff(&arg);
      pred[i] = static_cast<int>(arg);
      const std::int64_t label = labels.empty() ? -1 : labels[static_cast<std::size_t>(ids[i])];
      correct += label == pred[i] ? 1 : 0;
      logits_csv.stream() << iv.name << "," << ids[i] << "," << label << "," << pred[i];
      for (int c = 0; c < model.num_classes; ++c) logits_csv.stream() << "," << logits(static_cast<Eigen::Index>(i), c);
      logits_csv.stream() << "\n";
    }
    if (first_pred.empty()) first_pred = pred;
    int agree = 0;
    for (std::size_t i = 0; i < pred.size(); ++i) agree += pred[i] == first_pred[i] ? 1 : 0;
    const double n = static_cast<double>(ids.size());
    nlohmann::json row = {{"intervention", iv.name}, {"images", ids.size()},
                          {"accuracy", labels.empty() ? nlohmann::json() : nlohmann::json(correct / n)},
                          {"agree_with_first", agree / n}};
    // Against the logits the exporting framework wrote into the dump (the model as it ran there).
    if (iv.name == "none" && dump_logits.rows() > 0 && dump_logits.cols() == model.num_classes) {
      double worst = 0.0, top = 0.0;
      for (std::size_t i = 0; i < ids.size(); ++i) {
        const auto want = dump_logits.row(ids[i]).cast<double>();
        worst = std::max(worst, (logits.row(static_cast<Eigen::Index>(i)).cast<double>() - want).cwiseAbs().maxCoeff());
        top = std::max(top, want.cwiseAbs().maxCoeff());
      }
      row["dump_logits_max_rel_error"] = top > 0.0 ? worst / top : worst;
    }
    rows.push_back(row);
    table.stream() << iv.name << "," << ids.size() << "," << (labels.empty() ? "" : std::to_string(correct)) << ","
                   << (labels.empty() ? "" : std::to_string(correct / n)) << "," << agree / n << "\n";
    std::ostringstream acc;
    acc << std::setprecision(4) << (labels.empty() ? 0.0 : correct / n);
    std::cout << std::setw(22) << iv.name << std::setw(12) << (labels.empty() ? "n/a" : acc.str()) << agree / n;
    if (row.contains("dump_logits_max_rel_error")) {
      std::cout << "   (logits vs the dump's: max rel. error " << row["dump_logits_max_rel_error"].get<double>() << ")";
    }
    std::cout << "\n";
  }
  logits_csv.close();
  table.close();
  meta.results() = {{"rows", rows}};
  meta.publish(set);
  return 0;
}

const CommandRegistration kRegistration{
    {"replay", "run a model's forward pass in C++ on a dump's images, with interventions inside its "
               "attention (masks, query maps, a family swap): accuracy and logits",
     run_replay_cmd}};

}  // namespace
}  // namespace attnscope::app
