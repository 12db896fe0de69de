// The flags that choose part of a dump (--images, --layers, --heads, --transform) and bound the
// streaming loop's memory (--max-memory), shared by the analysis subcommands.
#pragma once

#include "common.hpp"
#include "model_layers.hpp"

#include "attnscope/analyses/dump_loop.hpp"
#include "attnscope/dump.hpp"
#include "attnscope/variant.hpp"
#include "attnscope/error.hpp"
#include "attnscope/query_transform.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

namespace attnscope::app {

struct SelectionFlags {
  std::string images, layers, heads;  ///< index lists like "0-9,15"; empty = all
  std::string transform = "none";     ///< none | f1 | f2 | l2norm
  std::string max_memory;             ///< e.g. "800M", "2G"; empty = the loop's default
};

/// --images LIST, declared here only; `default_images` is what leaving it out selects ("": all).
inline void add_images_option(po::options_description& d, std::string& images,
                              const std::string& default_images = "") {
  images = default_images;
  const std::string help = "images, e.g. 0-9,15 (default: " +
                           (default_images.empty() ? std::string("all") : default_images) + ")";
  d.add_options()("images", po::value(&images)->value_name("LIST"), help.c_str());
}

/// --max-memory SIZE, declared here only (add_selection_options declares it too).
inline void add_max_memory_option(po::options_description& d, SelectionFlags& f) {
  const std::string help = "memory for streaming the dump: images read ahead and HDF5's chunk "
                           "cache, e.g. 800M, 2G (default: " +
                           analyses::byte_size_text(analyses::kDefaultMaxMemory) + ")";
  d.add_options()("max-memory", po::value(&f.max_memory)->value_name("SIZE"), help.c_str());
}

/// --images, --layers, --heads and, with_transform, --transform. `default_images` as above.
inline void add_selection_options(po::options_description& d, SelectionFlags& f, bool with_transform,
                                  const std::string& default_images = "") {
  add_images_option(d, f.images, default_images);
  d.add_options()
      ("layers", po::value(&f.layers)->value_name("LIST"), "the model's layers, e.g. 0,11 (default: all)")
      ("heads", po::value(&f.heads)->value_name("LIST"), "heads, e.g. 0-2 (default: all)");
  if (with_transform) {
    d.add_options()("transform", po::value(&f.transform)->value_name("T")->default_value(f.transform),
                    "query transform applied before every family: none, f1, f2, l2norm");
  }
  add_max_memory_option(d, f);
}

/// The selection resolved against the dump (UsageError on a bad index; NothingToMeasure when the
/// dump holds no image, so that no analysis reports zeros over nothing).
inline analyses::Selection make_selection(const SelectionFlags& f, const DumpSchema& schema,
                                          std::uint64_t seed) {
  if (schema.num_images == 0) {
    throw NothingToMeasure("no images: " + schema.path + " holds 0 images, nothing to measure");
  }
  analyses::Selection sel;
  sel.images = analyses::parse_index_list(f.images, "--images");
  sel.layers = dump_layers_of(schema, analyses::parse_index_list(f.layers, "--layers"));
  sel.heads = analyses::parse_index_list(f.heads, "--heads");
  sel.transform = parse_query_transform(f.transform, seed);
  if (!f.max_memory.empty()) sel.max_memory = analyses::parse_byte_size(f.max_memory, "--max-memory");
  sel.stats = run_loop_stats();
  sel = analyses::resolve(schema, sel);
  // Refused before any result is written; an analysis that reads V or the model's own tensors
  // needs more, which the loop checks when it starts.
  analyses::Selection least = sel;
  least.need_v = false;
  (void)analyses::plan_loop_memory(schema, least);
  return sel;
}

inline nlohmann::json variant_names(const std::vector<Variant>& vs) {
  nlohmann::json j = nlohmann::json::array();
  for (const Variant& v : vs) j.push_back(v.name());
  return j;
}

/// Wall time between successive finished images (the streaming throughput per image), reported
/// as median, min and max in milliseconds. The median comes from a histogram of fixed size with
/// bins 1% wide (so memory does not grow with the number of images); min and max are exact. The
/// mean is the whole loop's wall time (from the timer's start to the last image) per image: where
/// images are computed together (confusion's pipelined loop) two can finish moments apart, so
/// the intervals spread out while their mean stays the throughput.
class ImageTimer {
 public:
  void tick() {
    const auto now = std::chrono::steady_clock::now();
    const double ms = std::chrono::duration<double, std::milli>(now - last_).count();
    last_ = now;
    min_ = n_ == 0 ? ms : std::min(min_, ms);
    max_ = n_ == 0 ? ms : std::max(max_, ms);
    ++n_;
    ++bins_[bin(ms)];
  }
  [[nodiscard]] nlohmann::json summary() const {
    if (n_ == 0) return nlohmann::json::object();
    const double total = std::chrono::duration<double, std::milli>(last_ - start_).count();
    return {{"median", std::clamp(median(), min_, max_)}, {"min", min_}, {"max", max_},
            {"mean", total / static_cast<double>(n_)}, {"images", n_}};
  }

 private:
  static constexpr double kLow = 1e-3;    // ms: everything below lands in bin 0
  static constexpr double kRatio = 1.01;  // each bin 1% wider than the last
  static constexpr std::size_t kBins = 2400;  // up to 1e-3 * 1.01^2400 ms, about 70 days
  static std::size_t bin(double ms) {
    if (!(ms > kLow)) return 0;
    const double b = std::log(ms / kLow) / std::log(kRatio);
    return std::min(kBins - 1, static_cast<std::size_t>(b));
  }
  static double centre(std::size_t b) { return kLow * std::pow(kRatio, static_cast<double>(b) + 0.5); }
  /// The median's bin centre (the mean of the two middle values' bins for an even count).
  [[nodiscard]] double median() const {
    const auto value_at = [this](std::size_t rank) {  // rank counts from 0
      std::size_t seen = 0;
      for (std::size_t b = 0; b < kBins; ++b) {
        seen += bins_[b];
        if (seen > rank) return centre(b);
      }
      return max_;
    };
    return n_ % 2 ? value_at(n_ / 2) : 0.5 * (value_at(n_ / 2 - 1) + value_at(n_ / 2));
  }
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_ = start_;
  std::vector<std::size_t> bins_ = std::vector<std::size_t>(kBins, 0);
  std::size_t n_ = 0;
  double min_ = 0, max_ = 0;
};

}  // namespace attnscope::app
