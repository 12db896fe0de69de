// The flags that choose part of a dump (--images, --layers, --heads, --transform), shared by the
// analysis subcommands.
#pragma once

#include "common.hpp"
#include "model_layers.hpp"

#include "attnscope/analyses/dump_loop.hpp"
#include "attnscope/dump.hpp"
#include "attnscope/error.hpp"
#include "attnscope/query_transform.hpp"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

namespace attnscope::app {

struct SelectionFlags {
  std::string images, layers, heads;  ///< index lists like "0-9,15"; empty = all
  std::string transform = "none";     ///< none | f1 | f2 | l2norm
};

/// --images LIST, declared here only; `default_images` is what leaving it out selects ("": all).
inline void add_images_option(po::options_description& d, std::string& images,
                              const std::string& default_images = "") {
  images = default_images;
  const std::string help = "images, e.g. 0-9,15 (default: " +
                           (default_images.empty() ? std::string("all") : default_images) + ")";
  d.add_options()("images", po::value(&images)->value_name("LIST"), help.c_str());
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
  return analyses::resolve(schema, sel);
}

inline nlohmann::json variant_names(const std::vector<Variant>& vs) {
  nlohmann::json j = nlohmann::json::array();
  for (const Variant& v : vs) j.push_back(v.name());
  return j;
}

/// Wall time between successive finished images (the streaming throughput per image), reported
/// as median, min and max in milliseconds.
class ImageTimer {
 public:
  void tick() {
    const auto now = std::chrono::steady_clock::now();
    ms_.push_back(std::chrono::duration<double, std::milli>(now - last_).count());
    last_ = now;
  }
  [[nodiscard]] nlohmann::json summary() const {
    if (ms_.empty()) return nlohmann::json::object();
    std::vector<double> s = ms_;
    std::sort(s.begin(), s.end());
    const std::size_t n = s.size();
    const double median = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    return {{"median", median}, {"min", s.front()}, {"max", s.back()}, {"images", n}};
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  std::vector<double> ms_;
};

}  // namespace attnscope::app
