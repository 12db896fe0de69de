#include "attnscope/run/result_files.hpp"

#include <cmath>
#include <iomanip>

namespace attnscope::run {

void write_locality_files(ResultSet& set, const analyses::LocalityResult& r, const char* name) {
  ResultFile f(set, name);
  f.stream() << "variant,layer,head,window,mean,std,min,max,queries,uniform_baseline\n"
             << std::setprecision(10);
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    for (const auto& h : r.per_head[v]) {
      const bool any = h.mass.count > 0;
      const auto own = r.layer_baselines.find(h.layer);
      f.stream() << analyses::row_variant_name(r.layer_variant_names, r.variants[v], h.layer)
                 << "," << h.layer << "," << h.head << "," << r.window << ","
                 << (any ? h.mass.mean : 0.0) << "," << h.mass.stddev() << ","
                 << (any ? h.mass.min : 0.0) << "," << (any ? h.mass.max : 0.0) << ","
                 << h.mass.count << ","
                 << (own == r.layer_baselines.end() ? r.uniform_baseline : own->second) << "\n";
    }
  }
  f.close();
}

std::vector<analyses::CensusCell> write_census_files(
    ResultSet& set, const std::vector<Variant>& variants,
    const std::vector<analyses::CensusCell>& cells) {
  ResultFile f(set, "census.csv");
  f.stream() << "variant,layer,head,weights,negative,zero,most_negative,rows_not_summing_to_one,"
                "max_row_sum_error\n"
             << std::setprecision(17);
  for (const auto& c : cells) {
    f.stream() << c.variant << "," << c.layer << "," << c.head << "," << c.weights << ","
               << c.negative << "," << c.zero << "," << c.most_negative << ","
               << c.rows_not_summing_to_one << "," << c.max_row_sum_error << "\n";
  }
  f.close();
  std::vector<analyses::CensusCell> out;
  for (const Variant& v : variants) {
    analyses::CensusCell t;
    t.variant = v.name();
    t.layer = t.head = -1;
    for (const auto& c : cells) {
      if (c.variant == t.variant) t.merge(c);
    }
    out.push_back(t);
  }
  return out;
}

nlohmann::json census_totals_json(const std::vector<analyses::CensusCell>& totals) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& t : totals) {
    out.push_back(
        {{"variant", t.variant},
         {"rows", t.rows},
         {"weights", t.weights},
         {"negative", t.negative},
         {"zero", t.zero},
         {"most_negative",
          std::isfinite(t.most_negative) ? nlohmann::json(t.most_negative) : nlohmann::json()},
         {"rows_not_summing_to_one", t.rows_not_summing_to_one},
         {"max_row_sum_error", t.max_row_sum_error},
         {"degenerate_rows", t.degenerate_rows}});
  }
  return out;
}

double mean_per_image(std::int64_t total, std::int64_t images) {
  return images > 0 ? static_cast<double>(total) / static_cast<double>(images) : 0.0;
}

ConfusionFiles::ConfusionFiles(ResultSet& set, std::vector<Variant> variants,
                               std::vector<int> model_layers, bool with_excluded_tokens)
    : set_(set), variants_(std::move(variants)), model_layers_(std::move(model_layers)) {
  per_image_ = std::make_unique<ResultFile>(set_, "confusion_per_image.csv");
  per_image_->stream() << "variant,image,count,degenerate_pairs\n";
  per_image_layer_ = std::make_unique<ResultFile>(set_, "confusion_per_image_layer.csv");
  per_image_layer_->stream() << "variant,image,layer,count,degenerate_pairs\n";
  if (with_excluded_tokens) {
    excluded_ = std::make_unique<ResultFile>(set_, "confusion_excluded_tokens.csv");
    excluded_->stream() << "image,excluded_tokens\n";
  }
}

ConfusionFiles::~ConfusionFiles() = default;

void ConfusionFiles::add_image(const analyses::ConfusionImage& img,
                               const analyses::ConfusionImageTotals& t) {
  for (std::size_t v = 0; v < variants_.size(); ++v) {
    per_image_->stream() << analyses::all_layers_variant_name(layer_variant_names_, variants_[v])
                         << "," << img.image << "," << t.count[v] << ","
                         << t.degenerate_pairs[v] << "\n";
    for (std::size_t l = 0; l < model_layers_.size(); ++l) {
      per_image_layer_->stream() << analyses::row_variant_name(layer_variant_names_, variants_[v],
                                                               model_layers_[l])
                                 << "," << img.image << ","
                                 << model_layers_[l] << "," << t.layer_count[v][l] << ","
                                 << t.layer_degenerate_pairs[v][l] << "\n";
    }
  }
  if (excluded_) excluded_->stream() << img.image << "," << img.excluded_tokens << "\n";
}

void ConfusionFiles::finish(const analyses::ConfusionResult& r) {
  per_image_->close();
  per_image_layer_->close();
  if (excluded_) excluded_->close();
  {
    ResultFile f(set_, "confusion_per_head.csv");
    f.stream() << "variant,layer,head,count,degenerate_rows,degenerate_pairs\n";
    for (std::size_t v = 0; v < r.variants.size(); ++v) {
      for (const auto& h : r.per_head[v]) {
        f.stream() << analyses::row_variant_name(r.layer_variant_names, r.variants[v], h.layer)
                   << "," << h.layer << "," << h.head << "," << h.count
                   << "," << h.degenerate_rows << "," << h.degenerate_pairs << "\n";
      }
    }
    f.close();
  }
  {
    ResultFile f(set_, "confusion_per_layer.csv");
    f.stream() << "variant,layer,count,images,mean_per_image,images_with_pairs,degenerate_pairs\n"
               << std::setprecision(10);
    for (std::size_t v = 0; v < r.variants.size(); ++v) {
      for (const auto& l : r.per_layer[v]) {
        f.stream() << analyses::row_variant_name(r.layer_variant_names, r.variants[v], l.layer)
                   << "," << l.layer << "," << l.count << "," << r.images
                   << "," << mean_per_image(l.count, r.images) << "," << l.images_with_pairs << ","
                   << l.degenerate_pairs << "\n";
      }
    }
    f.close();
  }
  ResultFile f(set_, "confusion_histogram.csv");
  f.stream() << "variant,bin,images,images_with_degenerate_pairs\n";
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    for (int b = 0; b < analyses::kConfusionBins; ++b) {
      f.stream() << analyses::all_layers_variant_name(r.layer_variant_names, r.variants[v]) << ","
                 << analyses::confusion_bin_labels()[b] << ","
                 << r.histogram[v][static_cast<std::size_t>(b)] << ","
                 << r.histogram_with_degenerate[v][static_cast<std::size_t>(b)] << "\n";
    }
  }
  f.close();
}

}  // namespace attnscope::run
