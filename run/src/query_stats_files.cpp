#include "attnscope/run/query_stats_files.hpp"

#include "attnscope/analyses/dump_loop.hpp"

#include <iomanip>
#include <limits>
#include <ostream>

namespace attnscope::run {

namespace {

/// mean (and min, max) of a quantity, "nan" where no image gave one.
void stat(std::ostream& os, const analyses::RunningStats& s, bool range) {
  if (s.count == 0) {
    os << ",nan" << (range ? ",nan,nan" : "");
    return;
  }
  os << "," << s.mean;
  if (range) os << "," << s.min << "," << s.max;
}

std::int64_t counter_sum(const std::vector<analyses::QueryStatsCell>& cells, std::size_t c) {
  std::int64_t n = 0;
  for (const auto& cell : cells) n += cell.counters[c];
  return n;
}

}  // namespace

std::map<int, double> layer_means(const std::vector<analyses::QueryStatsCell>& cells,
                                  std::size_t q, double scale) {
  std::map<int, analyses::RunningStats> layers;
  for (const auto& c : cells) {
    if (c.images[q].count > 0) layers[c.layer].add(c.images[q].mean * scale);
  }
  std::map<int, double> out;
  for (const auto& [layer, s] : layers) out[layer] = s.mean;
  return out;
}

void write_histogram(ResultSet& set, const analyses::QueryStatsResult& r, const std::string& file,
                     const std::string& count_column) {
  const double inf = std::numeric_limits<double>::infinity();
  const analyses::HistogramBins& bins = r.layout.bins;
  ResultFile f(set, file);
  std::ostream& os = f.stream();
  os << "variant,layer,head,bin,lo,hi," << count_column << "\n" << std::setprecision(10);
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    for (const auto& c : r.cells[v]) {
      for (std::size_t b = 0; b < bins.slots(); ++b) {
        os << analyses::row_variant_name(r.layer_variant_names, r.variants[v], c.layer) << "," << c.layer << "," << c.head << ",";
        if (b == 0) {
          os << "below," << -inf << "," << bins.lo;
        } else if (b == bins.slots() - 1) {
          os << "above," << bins.hi << "," << inf;
        } else {
          const int i = static_cast<int>(b) - 1;
          os << i << "," << bins.edge(i) << "," << bins.edge(i + 1);
        }
        os << "," << c.histogram[b] << "\n";
      }
    }
  }
  f.close();
}

void write_entropy_files(ResultSet& set, const analyses::QueryStatsResult& r) {
  ResultFile f(set, "entropy.csv");
  f.stream() << "variant,layer,head,mean_entropy,mean_normalised,image_std,query_std,min,max,"
                "queries,images,degenerate_rows,negative_weight_rows,mean_negative_mass\n"
             << std::setprecision(10);
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    for (const auto& c : r.cells[v]) {
      const analyses::RunningStats& q = c.queries[0];
      const bool any = q.count > 0;
      const double mean = c.images[0].mean;
      f.stream() << analyses::row_variant_name(r.layer_variant_names, r.variants[v], c.layer) << ","
                 << c.layer << "," << c.head << "," << mean << "," << c.images[2].mean << ","
                 << c.images[0].stddev() << "," << q.stddev() << "," << (any ? q.min : 0.0) << ","
                 << (any ? q.max : 0.0) << "," << q.count << "," << c.images[0].count << ","
                 << c.counters[0] << "," << c.counters[1] << "," << c.queries[1].mean << "\n";
    }
  }
  f.close();
  write_histogram(set, r, "entropy_histogram.csv", "queries");
}

nlohmann::json entropy_results(const analyses::QueryStatsResult& r, double log_n) {
  nlohmann::json variants = nlohmann::json::array();
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    nlohmann::json layers = nlohmann::json::array();
    const std::map<int, double> normalised = layer_means(r.cells[v], 2);
    for (const auto& [layer, mean] : layer_means(r.cells[v], 0)) {
      layers.push_back(
          {{"layer", layer}, {"mean_entropy", mean}, {"mean_normalised", normalised.at(layer)}});
    }
    variants.push_back({{"variant", analyses::all_layers_variant_name(r.layer_variant_names, r.variants[v])},
                        {"per_layer", layers},
                        {"negative_weight_rows", counter_sum(r.cells[v], 1)}});
  }
  return {{"images", r.images}, {"log_n", log_n}, {"variants", variants}};
}

void write_distance_files(ResultSet& set, const analyses::QueryStatsResult& r) {
  ResultFile f(set, "distance.csv");
  f.stream() << "variant,layer,head,mean_distance,image_std,query_std,min,max,queries,images,"
                "mean_grid_mass,degenerate_rows,negative_weight_rows,rows_without_grid_mass\n"
             << std::setprecision(10);
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    for (const auto& c : r.cells[v]) {
      const analyses::RunningStats& q = c.queries[0];
      const bool any = q.count > 0;
      f.stream() << analyses::row_variant_name(r.layer_variant_names, r.variants[v], c.layer) << "," << c.layer << "," << c.head << ","
                 << c.images[0].mean << "," << c.images[0].stddev() << "," << q.stddev() << ","
                 << (any ? q.min : 0.0) << "," << (any ? q.max : 0.0) << "," << q.count << ","
                 << c.images[0].count << "," << c.queries[1].mean << "," << c.counters[0] << ","
                 << c.counters[1] << "," << c.counters[2] << "\n";
    }
  }
  f.close();
  write_histogram(set, r, "distance_histogram.csv", "queries");
}

nlohmann::json distance_results(const analyses::QueryStatsResult& r,
                                const analyses::PatchGeometry& geometry, bool renormalise,
                                const std::vector<Variant>& own) {
  nlohmann::json variants = nlohmann::json::array();
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& [layer, mean] : layer_means(r.cells[v], 0)) {
      layers.push_back({{"layer", layer}, {"mean_distance", mean}});
    }
    const std::int64_t negative = counter_sum(r.cells[v], 1);
    bool signed_weights = r.variants[v].family->weights_can_be_negative() || negative > 0;
    for (const Variant& o : own) signed_weights = signed_weights || o.family->weights_can_be_negative();
    variants.push_back(
        {{"variant", analyses::all_layers_variant_name(r.layer_variant_names, r.variants[v])},
         {"per_layer", layers},
         {"negative_weight_rows", negative},
         {"weights", signed_weights ? "signed: the weights as given, negative ones included; a "
                                      "row's distance is a signed sum and can fall outside [0, "
                                      "max_distance]"
                                    : "non-negative"}});
  }
  return {{"images", r.images},
          {"max_distance", geometry.max_distance()},
          {"uniform_baseline", analyses::uniform_distance(geometry, renormalise)},
          {"variants", variants}};
}

void write_rank_files(ResultSet& set, const analyses::QueryStatsResult& r) {
  ResultFile f(set, "rank.csv");
  f.stream() << "variant,layer,head,images,mean_rank,min_rank,max_rank,mean_erank,mean_kv_rank,"
                "min_kv_rank,max_kv_rank,mean_kv_erank,mean_k_ratio,min_k_ratio,max_k_ratio,"
                "mean_k1_ratio,min_k1_ratio,max_k1_ratio,mean_fk_ratio,min_fk_ratio,max_fk_ratio,"
                "mean_fk1_ratio,min_fk1_ratio,max_fk1_ratio,k_full_rank_images,"
                "k1_full_rank_images,fk_full_rank_images,fk1_full_rank_images,"
                "mean_out_residual,min_out_residual,max_out_residual,out_images,degenerate_rows\n"
             << std::setprecision(10);
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    for (const auto& c : r.cells[v]) {
      // images: those with a matrix (a layer of windows has one per window: the stats are over
      // every (image, window), the full-rank counts count windows)
      f.stream() << analyses::row_variant_name(r.layer_variant_names, r.variants[v], c.layer) << ","
                 << c.layer << "," << c.head << "," << c.images[0].count;
      stat(f.stream(), c.queries[0], true);   // rank
      stat(f.stream(), c.queries[1], false);  // erank
      stat(f.stream(), c.queries[2], true);   // kv rank
      stat(f.stream(), c.queries[3], false);  // kv erank
      for (std::size_t q = 4; q < 8; ++q) stat(f.stream(), c.queries[q], true);  // ratios
      for (std::size_t k = 1; k < 5; ++k) f.stream() << "," << c.counters[k];
      stat(f.stream(), c.queries[8], true);
      f.stream() << "," << c.queries[8].count << "," << c.counters[0] << "\n";
    }
  }
  f.close();
  write_histogram(set, r, "rank_histogram.csv", "images");
}

nlohmann::json rank_results(const analyses::QueryStatsResult& r) {
  nlohmann::json variants = nlohmann::json::array();
  for (std::size_t v = 0; v < r.variants.size(); ++v) {
    nlohmann::json layers = nlohmann::json::array();
    const auto rank = layer_means(r.cells[v], 0), erank = layer_means(r.cells[v], 1);
    const auto kv = layer_means(r.cells[v], 2), residual = layer_means(r.cells[v], 8);
    for (const auto& [layer, mean] : rank) {
      nlohmann::json l = {{"layer", layer}, {"mean_rank", mean}, {"mean_erank", erank.at(layer)}};
      if (kv.count(layer) != 0) l["mean_kv_rank"] = kv.at(layer);
      if (residual.count(layer) != 0) l["mean_out_residual"] = residual.at(layer);
      layers.push_back(std::move(l));
    }
    variants.push_back({{"variant", analyses::all_layers_variant_name(r.layer_variant_names, r.variants[v])}, {"per_layer", layers}});
  }
  return {{"images", r.images}, {"variants", variants}};
}

std::int64_t rank_measured_rows(const analyses::QueryStatsResult& r, int tokens) {
  std::int64_t rows = 0;
  for (const auto& cells : r.cells) {
    for (const auto& c : cells) rows += c.queries[0].count * tokens - c.counters[0];
  }
  return rows;
}

}  // namespace attnscope::run
