// Sweeps over many queries: choosing them in a dump, collecting their sweeps as heads arrive, and
// the runs that feed them heads (spikiness_run.hpp).
#include "attnscope/analyses/spikiness.hpp"
#include "attnscope/analyses/spikiness_run.hpp"

#include "attnscope/analyses/head_error.hpp"
#include "attnscope/error.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <tuple>
#include <utility>

namespace attnscope::analyses {

namespace {

auto head_key(const QuerySample& s) { return std::tie(s.image, s.layer, s.head); }

bool sample_less(const QuerySample& a, const QuerySample& b) {
  return std::tie(a.image, a.layer, a.head, a.token) < std::tie(b.image, b.layer, b.head, b.token);
}

// Uniform integer in [0, bound) without modulo bias (the standard distributions are not portable).
std::uint64_t uniform_below(std::mt19937_64& gen, std::uint64_t bound) {
  const std::uint64_t limit = ~std::uint64_t{0} - ~std::uint64_t{0} % bound;
  std::uint64_t x = gen();
  while (x >= limit) x = gen();
  return x % bound;
}

QuerySample unflatten(const Selection& sel, int num_tokens, std::uint64_t flat) {
  QuerySample s;
  const auto tokens = static_cast<std::uint64_t>(num_tokens);
  const auto heads = static_cast<std::uint64_t>(sel.heads.size());
  const auto layers = static_cast<std::uint64_t>(sel.layers.size());
  s.token = static_cast<int>(flat % tokens);
  flat /= tokens;
  s.head = sel.heads[static_cast<std::size_t>(flat % heads)];
  flat /= heads;
  s.layer = sel.layers[static_cast<std::size_t>(flat % layers)];
  flat /= layers;
  s.image = sel.images[static_cast<std::size_t>(flat)];
  return s;
}

}  // namespace

std::vector<QuerySample> draw_samples(const Selection& sel, int num_tokens, int count,
                                      std::uint64_t seed) {
  if (count < 0) throw UsageError("--samples must be >= 0, got " + std::to_string(count));
  const std::uint64_t total = static_cast<std::uint64_t>(sel.images.size()) * sel.layers.size() *
                              sel.heads.size() * static_cast<std::uint64_t>(num_tokens);
  std::set<std::uint64_t> chosen;
  if (static_cast<std::uint64_t>(count) >= total) {
    for (std::uint64_t i = 0; i < total; ++i) chosen.insert(i);
  } else {
    // Floyd's algorithm: `count` distinct draws, each one draw from the generator.
    std::mt19937_64 gen(seed);
    for (std::uint64_t j = total - static_cast<std::uint64_t>(count); j < total; ++j) {
      const std::uint64_t t = uniform_below(gen, j + 1);
      if (!chosen.insert(t).second) chosen.insert(j);
    }
  }
  std::vector<QuerySample> out;
  for (std::uint64_t flat : chosen) out.push_back(unflatten(sel, num_tokens, flat));
  std::sort(out.begin(), out.end(), sample_less);
  return out;
}

std::vector<QuerySample> grid_samples(const Selection& sel, int num_tokens,
                                      const std::vector<int>& tokens) {
  for (int t : tokens) {
    if (t < 0 || t >= num_tokens) {
      throw UsageError("--tokens: token " + std::to_string(t) + " is out of range [0, " +
                       std::to_string(num_tokens) + ")");
    }
  }
  std::vector<QuerySample> out;
  for (int image : sel.images)
    for (int layer : sel.layers)
      for (int head : sel.heads)
        for (int token : tokens) out.push_back({image, layer, head, token});
  std::sort(out.begin(), out.end(), sample_less);
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

SpikinessCollector::SpikinessCollector(std::vector<Variant> variants,
                                       std::vector<QuerySample> samples, double scale,
                                       SpikinessOptions opts, int keep_weights)
    : scale_(scale), opts_(std::move(opts)), keep_weights_(keep_weights) {
  std::sort(samples.begin(), samples.end(), sample_less);
  result_.variants = std::move(variants);
  result_.samples = std::move(samples);
  result_.sweeps.assign(result_.variants.size(), std::vector<QuerySweep>(result_.samples.size()));
  done_.assign(result_.samples.size(), 0);
  laws_.resize(result_.variants.size());
}

void SpikinessCollector::add_head(const HeadView& h) {
  const QuerySample key{h.image, h.layer, h.head, 0};
  const auto [first, last] = std::equal_range(
      result_.samples.begin(), result_.samples.end(), key,
      [](const QuerySample& a, const QuerySample& b) { return head_key(a) < head_key(b); });
  if (first == last) return;
  const MatD k = h.k.cast<double>();
  for (std::size_t v = 0; v < result_.variants.size(); ++v) {
    const HeadSweeper sweeper = in_head(h.image, h.layer, h.head, [&] {
      return HeadSweeper(head_variant(result_.variants[v], h), k, scale_, opts_, &h.q);
    });
    std::vector<LawResult> laws = sweeper.laws();
    for (auto it = first; it != last; ++it) {
      const auto i = static_cast<std::size_t>(it - result_.samples.begin());
      const VecD q = h.q.row(it->token).cast<double>().transpose();
      // Each sample lives in one head only: no other thread writes this slot.
      result_.sweeps[v][i] = in_head(h.image, h.layer, h.head, [&] {
        return sweeper.sweep(q, it->token, static_cast<int>(i) < keep_weights_, &laws);
      });
      done_[i] = 1;
    }
    const std::lock_guard lock(mutex_);
    if (laws_[v].empty()) {
      laws_[v] = std::move(laws);
    } else {
      for (std::size_t l = 0; l < laws.size(); ++l) laws_[v][l].merge(laws[l]);
    }
  }
}

SpikinessImage SpikinessCollector::take_image(int image) {
  SpikinessImage out;
  out.image = image;
  const QuerySample key{image, 0, 0, 0};
  const auto [first, last] = std::equal_range(
      result_.samples.begin(), result_.samples.end(), key,
      [](const QuerySample& a, const QuerySample& b) { return a.image < b.image; });
  for (auto it = first; it != last; ++it) {
    const auto i = static_cast<std::size_t>(it - result_.samples.begin());
    if (done_[i] == 0) {
      throw Error("spikiness: the head of sample (image " + std::to_string(it->image) + ", layer " +
                  std::to_string(it->layer) + ", head " + std::to_string(it->head) +
                  ") was never computed");
    }
    out.samples.push_back(i);
  }
  out.sweeps.resize(result_.variants.size());
  for (std::size_t v = 0; v < result_.variants.size(); ++v) {
    for (std::size_t i : out.samples) out.sweeps[v].push_back(std::move(result_.sweeps[v][i]));
  }
  out.laws = std::exchange(laws_, std::vector<std::vector<LawResult>>(result_.variants.size()));
  return out;
}

void SpikinessCollector::add_image(SpikinessImage&& image) {
  const std::size_t nv = result_.variants.size();
  const auto bad = [&image](const std::string& what) {
    return Error("spikiness: the part of image " + std::to_string(image.image) + " " + what);
  };
  if (image.sweeps.size() != nv || image.laws.size() != nv) throw bad("does not match the variants");
  for (std::size_t k = 0; k < image.samples.size(); ++k) {
    const std::size_t i = image.samples[k];
    if (i >= result_.samples.size() || result_.samples[i].image != image.image) {
      throw bad("names a sample of another image");
    }
    for (std::size_t v = 0; v < nv; ++v) {
      if (image.sweeps[v].size() != image.samples.size()) throw bad("lacks sweeps");
      result_.sweeps[v][i] = std::move(image.sweeps[v][k]);
    }
    done_[i] = 1;
  }
  for (std::size_t v = 0; v < nv; ++v) {
    if (laws_[v].empty()) {
      laws_[v] = std::move(image.laws[v]);
    } else if (!image.laws[v].empty()) {
      if (image.laws[v].size() != laws_[v].size()) throw bad("has other laws");
      for (std::size_t l = 0; l < laws_[v].size(); ++l) laws_[v][l].merge(image.laws[v][l]);
    }
  }
}

SpikinessResult SpikinessCollector::finish() {
  for (std::size_t i = 0; i < done_.size(); ++i) {
    if (done_[i] == 0) {
      const QuerySample& s = result_.samples[i];
      throw Error("spikiness: the head of sample (image " + std::to_string(s.image) + ", layer " +
                  std::to_string(s.layer) + ", head " + std::to_string(s.head) +
                  ") was never computed");
    }
  }
  result_.laws.clear();
  for (auto& laws : laws_) {
    for (auto& l : laws) result_.laws.push_back(std::move(l));
  }
  return std::move(result_);
}

}  // namespace attnscope::analyses

// ---- Runs: sources of heads, the sweep over them, medians (spikiness_run.hpp) ------------------

namespace attnscope::analyses {

HeadSource HeadSource::dump(DumpReader& reader) {
  HeadSource s;
  s.name_ = "dump";
  s.schema_ = reader.schema();
  s.loop_ = [&reader](const Selection& sel, const HeadFn& fn, const ImageFn& on_image) {
    analyses::for_each_head(reader, sel, fn, on_image);
  };
  return s;
}

HeadSource HeadSource::synthetic(const SynthOptions& options) {
  HeadSource s;
  s.name_ = "synthetic";
  s.schema_.path = "synthetic";
  s.schema_.attrs = options.attributes();
  s.schema_.num_images = options.images;
  s.schema_.layer_has_attn.assign(static_cast<std::size_t>(options.layers), false);
  s.schema_.layer_has_out.assign(static_cast<std::size_t>(options.layers), false);
  s.loop_ = [options](const Selection& sel, const HeadFn& fn, const ImageFn& on_image) {
    for (int image : sel.images) {
      const ImageQKV img = synth_image(options, image);
      for (int layer : sel.layers) {
        for (int head : sel.heads) {
          const MatF& raw = img.Q(layer, head);
          const MatF q = sel.transform.apply<float>(raw);
          fn(HeadView{image, layer, head, q, img.K(layer, head), img.V(layer, head), &raw});
        }
      }
      if (on_image) on_image(image);
    }
  };
  return s;
}

void HeadSource::for_each_head(const Selection& resolved, const HeadFn& fn,
                               const ImageFn& on_image) const {
  loop_(resolved, fn, on_image);
}

std::vector<int> sample_images(const std::vector<QuerySample>& samples) {
  std::set<int> images;
  for (const auto& s : samples) images.insert(s.image);
  return {images.begin(), images.end()};
}

SpikinessResult run_spikiness(const HeadSource& source, const Selection& resolved,
                              std::vector<Variant> variants, std::vector<QuerySample> samples,
                              const SpikinessOptions& options, int keep_weights,
                              const HeadSource::ImageFn& on_image) {
  Selection wanted = resolved;  // only the images holding a sample are read
  wanted.need_v = false;        // and only their Q and K
  wanted.images = sample_images(samples);
  SpikinessCollector collector(std::move(variants), std::move(samples),
                               source.schema().attrs.scale, options, keep_weights);
  source.for_each_head(
      wanted, [&](const HeadView& h) { collector.add_head(h); }, on_image);
  return collector.finish();
}

void spikiness_images(const HeadSource& source, const Selection& resolved,
                      const std::vector<Variant>& variants, const std::vector<QuerySample>& samples,
                      const SpikinessOptions& options, int keep_weights,
                      const std::vector<int>& images,
                      const std::function<void(SpikinessImage&&)>& sink) {
  Selection wanted = resolved;  // only Q and K of the given images
  wanted.need_v = false;
  wanted.images = images;
  SpikinessCollector collector(variants, samples, source.schema().attrs.scale, options,
                               keep_weights);
  source.for_each_head(
      wanted, [&](const HeadView& h) { collector.add_head(h); },
      [&](int image) { sink(collector.take_image(image)); });
}

bool has_ratio(const SpikinessResult& r) {
  for (const auto& sweeps : r.sweeps) {
    for (const auto& sweep : sweeps) {
      for (const auto& p : sweep.points) {
        if (!std::isnan(p.ratio)) return true;
      }
    }
  }
  return false;
}

double median_ignoring_nan(std::vector<double> x) {
  x.erase(std::remove_if(x.begin(), x.end(), [](double v) { return std::isnan(v); }), x.end());
  if (x.empty()) return std::nan("");
  std::sort(x.begin(), x.end());
  const std::size_t n = x.size();
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

std::vector<std::vector<ScaleMedians>> spikiness_medians(const SpikinessResult& r,
                                                         std::size_t scales) {
  std::vector<std::vector<ScaleMedians>> out;
  for (const auto& sweeps : r.sweeps) {
    std::vector<ScaleMedians> rows;
    for (std::size_t s = 0; s < scales; ++s) {
      std::vector<double> ratio, eff;
      for (const auto& sweep : sweeps) {
        ratio.push_back(sweep.points[s].ratio);
        eff.push_back(sweep.points[s].stats.effective_keys);
      }
      rows.push_back({sweeps.empty() ? 0.0 : sweeps[0].points[s].scale,
                      median_ignoring_nan(std::move(ratio)), median_ignoring_nan(std::move(eff))});
    }
    out.push_back(std::move(rows));
  }
  return out;
}

}  // namespace attnscope::analyses
