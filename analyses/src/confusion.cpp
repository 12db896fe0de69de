// Confusion counting: the exact pair judge, the per-head entry points and the streaming driver.
#include "attnscope/analyses/confusion.hpp"

#include "attnscope/analyses/geometry_heads.hpp"
#include "attnscope/analyses/head_error.hpp"
#include "attnscope/error.hpp"
#include "confusion_search.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace attnscope::analyses {

void check_confusion_options(const ConfusionOptions& opt, const std::string& eps_name,
                             const std::string& query_eps_name) {
  for (const auto& [name, x] : {std::pair<const std::string&, double>{eps_name, opt.eps},
                                {query_eps_name, opt.query_eps}}) {
    if (!(x >= 0.0) || !std::isfinite(x)) {
      std::ostringstream found;
      found << x;
      throw UsageError(name + ": expected a finite radius >= 0, found " + found.str());
    }
  }
}

namespace detail {

void PairJudge::reset(int queries, int keys, const MatF& q_raw, const ConfusionOptions& opt,
                      RowFn row, const ExcludedTokens* excluded) {
  if (q_raw.rows() != queries) throw UsageError("confusion: raw queries do not match the head");
  if (excluded != nullptr && !excluded->empty() &&
      excluded->size() != static_cast<std::size_t>(queries)) {
    throw UsageError("confusion: the excluded tokens (" + std::to_string(excluded->size()) +
                     ") do not match the head's " + std::to_string(queries) + " queries");
  }
  row_ = std::move(row);
  q_raw_ = &q_raw;
  excluded_ = excluded != nullptr && !excluded->empty() ? excluded : nullptr;
  n_ = keys;
  used_ = 0;
  eps_ = opt.eps;
  eps2_ = opt.eps * opt.eps;
  query_eps2_ = opt.query_eps * opt.query_eps;
  slot_.assign(static_cast<std::size_t>(queries), -1);
}

bool PairJudge::queries_differ(int i, int j) const {
  const auto d = static_cast<int>(q_raw_->cols());
  return squared_distance_of(q_raw_->row(i).data(), q_raw_->row(j).data(), d) > query_eps2_;
}

bool PairJudge::rows_within(int i, int j) {
  // Both slots first: computing row j may grow the pool and move row i.
  const std::size_t a = slot(i), b = slot(j);
  return squared_distance(pool_.data() + a, pool_.data() + b, n_) <= eps2_;
}

std::size_t PairJudge::slot(int i) {
  int& s = slot_[static_cast<std::size_t>(i)];
  if (s < 0) {
    s = used_++;
    const auto need = static_cast<std::size_t>(used_) * static_cast<std::size_t>(n_);
    if (pool_.size() < need) pool_.resize(std::max(need, 2 * pool_.size()));
    row_(i, pool_.data() + static_cast<std::size_t>(s) * static_cast<std::size_t>(n_));
  }
  return static_cast<std::size_t>(s) * static_cast<std::size_t>(n_);
}

namespace {

/// One per thread: the judge's row cache and the score form's buffers outlive the head, so a thread
/// allocates (and the kernel zero-fills pages) only when it meets a larger head than before.
struct Workspace {
  PairJudge judge;
  ScoreWorkspace scores;
};

Workspace& thread_workspace() {
  thread_local Workspace ws;
  return ws;
}

HeadConfusion count_scores(const ScoreFamily& family, const Variant& v, const MatF& q,
                           const MatF& q_raw, const MatF& k, double scale,
                           const ConfusionOptions& opt, const ExcludedTokens* excluded) {
  if (q.rows() != k.rows() || q.cols() != k.cols()) {
    throw UsageError("confusion: q and k of one head must have the same shape");
  }
  std::string why;
  if (!v.supports(&why)) throw UsageError(v.name() + ": " + why);
  Workspace& ws = thread_workspace();
  ScoreWorkspace& sw = ws.scores;
  const int n = static_cast<int>(k.rows()), d = static_cast<int>(k.cols());
  sw.qi.resize(static_cast<std::size_t>(d));
  sw.double_rows = false;
  // Exact rows exactly as ExactRows computes them, for the rows the search asks about only; the
  // keys are widened to double (and transposed) when the first such row is needed (most heads
  // need none or few).
  // A head searched on its double rows has them all already: copied, bit for bit the same.
  bool keys_ready = false;
  auto row = [&family, &q, &k, &sw, &keys_ready, n, d, scale](int i, double* out) {
    if (sw.double_rows) {
      std::copy_n(sw.wd.row(i).data(), n, out);
      return;
    }
    if (!keys_ready) family.transpose_keys(k, sw.kt), keys_ready = true;
    for (int t = 0; t < d; ++t) sw.qi[static_cast<std::size_t>(t)] = static_cast<double>(q(i, t));
    family.exact_row_t(sw.qi.data(), sw.kt.data(), n, d, scale, out);  // exact_row's bits
  };
  ws.judge.reset(static_cast<int>(q.rows()), n, q_raw, opt, row, excluded);
  return search_scores(family, q, k, scale, ws.judge, sw);
}

}  // namespace

/// Pairs i < j of degenerate rows whose raw queries differ, decided as PairJudge::queries_differ
/// decides them. The queries are sorted on their first raw coordinate x: the judge's sum of
/// squares starts with fl((x_i - x_j)^2) and rounding never makes a sum of non-negative terms
/// smaller, so a pair with fl((x_i - x_j)^2) > query_eps^2 differs without a look; only pairs
/// inside that window are checked in full.
std::int64_t count_degenerate_pairs(const ExactRows& rows, const MatF& q_raw, double query_eps,
                                    const PairJudge& judge) {
  std::vector<std::pair<double, int>> keyed;
  for (int i = 0; i < rows.tokens(); ++i) {
    if (!rows.degenerate(i) || judge.excluded(i)) continue;
    const double x = q_raw.cols() > 0 ? static_cast<double>(q_raw(i, 0)) : 0.0;
    // A NaN would make the sort's order undefined.
    if (!std::isfinite(x)) {
      throw NumericalError("confusion: raw query " + std::to_string(i) + " is not finite");
    }
    keyed.emplace_back(x, i);
  }
  std::sort(keyed.begin(), keyed.end());
  const double query_eps2 = query_eps * query_eps;
  const auto k = static_cast<std::int64_t>(keyed.size());
  std::int64_t same = 0;  // pairs within query_eps: the same query, not a confusion
  for (std::size_t a = 0; a < keyed.size(); ++a) {
    for (std::size_t b = a + 1; b < keyed.size(); ++b) {
      const double dx = keyed[b].first - keyed[a].first;
      if (dx * dx > query_eps2) break;  // and so for every later b: x only grows
      const int i = std::min(keyed[a].second, keyed[b].second);
      const int j = std::max(keyed[a].second, keyed[b].second);
      if (!judge.queries_differ(i, j)) ++same;
    }
  }
  return k * (k - 1) / 2 - same;
}

}  // namespace detail

HeadConfusion count_confusion(const Variant& v, const MatF& q, const MatF& q_raw, const MatF& k,
                              double scale, const ConfusionOptions& opt,
                              const ExcludedTokens* excluded) {
  if (opt.device == Device::Cuda) return count_confusion_cuda(v, q, q_raw, k, scale, opt, excluded);
  if (const ScoreFamily* scores = v.score()) {
    return detail::count_scores(*scores, v, q, q_raw, k, scale, opt, excluded);
  }
  const ExactRows rows(v, q, k, scale);
  detail::PairJudge& judge = detail::thread_workspace().judge;
  auto row = [&rows](int i, double* out) { rows.row(i, out); };
  judge.reset(rows.tokens(), rows.tokens(), q_raw, opt, row, excluded);
  HeadConfusion out = detail::search_low_rank(rows, judge);
  out.degenerate_rows = rows.degenerate_count();
  out.degenerate_pairs = detail::count_degenerate_pairs(rows, q_raw, opt.query_eps, judge);
  return out;
}

int confusion_bin(std::int64_t count) {
  if (count <= 0) return 0;
  int bin = 1;
  while (bin < kConfusionBins - 1 && count >= (std::int64_t{1} << bin)) ++bin;
  return bin;
}

const std::array<std::string, kConfusionBins>& confusion_bin_labels() {
  static const std::array<std::string, kConfusionBins> labels = {"0",    "1",     "2-3",  "4-7",
                                                                 "8-15", "16-31", ">=32"};
  return labels;
}

ConfusionTotals::ConfusionTotals(const std::vector<Variant>& variants, const Selection& resolved,
                                 int tokens)
    : tokens_(tokens), heads_(std::max(1, static_cast<int>(resolved.heads.size()))) {
  const std::size_t nv = variants.size(), nh = resolved.heads.size();
  const std::size_t slots = resolved.layers.size() * nh;
  res_.variants = variants;
  res_.per_head.assign(nv, std::vector<ConfusionHeadTotal>(slots));
  res_.per_layer.assign(nv, std::vector<ConfusionLayerTotal>(resolved.layers.size()));
  for (auto& layers : res_.per_layer) {
    for (std::size_t l = 0; l < layers.size(); ++l) layers[l].layer = resolved.layers[l];
  }
  res_.histogram.assign(nv, {});
  res_.histogram_with_degenerate.assign(nv, {});
  for (auto& heads : res_.per_head) {
    for (std::size_t s = 0; s < slots; ++s) {
      heads[s].layer = resolved.layers[s / nh];
      heads[s].head = resolved.heads[s % nh];
    }
  }
}

ConfusionImageTotals ConfusionTotals::add(const ConfusionImage& img) {
  const std::size_t nv = res_.variants.size();
  if (img.heads.size() != nv) throw Error("confusion: an image's counts do not match the variants");
  if (img.excluded_tokens < 0 || img.excluded_tokens > tokens_) {
    throw Error("confusion: image " + std::to_string(img.image) + " has " +
                std::to_string(img.excluded_tokens) + " excluded tokens of " +
                std::to_string(tokens_));
  }
  const std::size_t layers = nv == 0 ? 0 : res_.per_layer.front().size();
  ConfusionImageTotals t;
  t.count.assign(nv, 0);
  t.degenerate_pairs.assign(nv, 0);
  t.layer_count.assign(nv, std::vector<std::int64_t>(layers, 0));
  t.layer_degenerate_pairs.assign(nv, std::vector<std::int64_t>(layers, 0));
  for (std::size_t vi = 0; vi < nv; ++vi) {
    if (img.heads[vi].size() != res_.per_head[vi].size()) {
      throw Error("confusion: an image's counts do not match the selection's heads");
    }
    for (std::size_t s = 0; s < img.heads[vi].size(); ++s) {
      const HeadConfusion& h = img.heads[vi][s];
      const std::size_t l = s / static_cast<std::size_t>(heads_);
      t.count[vi] += h.pairs;
      t.degenerate_pairs[vi] += h.degenerate_pairs;
      t.layer_count[vi][l] += h.pairs;
      t.layer_degenerate_pairs[vi][l] += h.degenerate_pairs;
      res_.per_head[vi][s].count += h.pairs;
      res_.per_head[vi][s].degenerate_rows += h.degenerate_rows;
      res_.per_head[vi][s].degenerate_pairs += h.degenerate_pairs;
      res_.candidates += h.candidates;
    }
    for (std::size_t l = 0; l < layers; ++l) {
      ConfusionLayerTotal& lt = res_.per_layer[vi][l];
      lt.count += t.layer_count[vi][l];
      lt.degenerate_pairs += t.layer_degenerate_pairs[vi][l];
      lt.images_with_pairs += t.layer_count[vi][l] > 0 ? 1 : 0;
    }
    ++res_.histogram[vi][static_cast<std::size_t>(confusion_bin(t.count[vi]))];
    ++res_.histogram_with_degenerate[vi][static_cast<std::size_t>(
        confusion_bin(t.count[vi] + t.degenerate_pairs[vi]))];
  }
  res_.min_excluded_tokens = res_.images == 0
                                 ? img.excluded_tokens
                                 : std::min(res_.min_excluded_tokens, img.excluded_tokens);
  res_.max_excluded_tokens = res_.images == 0
                                 ? img.excluded_tokens
                                 : std::max(res_.max_excluded_tokens, img.excluded_tokens);
  res_.excluded_tokens += img.excluded_tokens;
  res_.images_with_two_tokens_left += tokens_ - img.excluded_tokens >= 2 ? 1 : 0;
  ++res_.images;
  return t;
}

void confusion_images(DumpReader& reader, const Selection& resolved,
                      const std::vector<Variant>& variants, const ConfusionOptions& opt,
                      bool reference, const std::function<void(ConfusionImage&&)>& sink) {
  const DumpSchema& schema = reader.schema();
  const double scale = schema.attrs.scale;
  const std::size_t nv = variants.size(), nh = resolved.heads.size();
  const std::size_t slots = resolved.layers.size() * nh;
  // Slot of a (layer, head) in the per-head tables.
  std::vector<int> layer_slot(static_cast<std::size_t>(schema.attrs.num_layers), -1);
  std::vector<int> head_slot(static_cast<std::size_t>(schema.max_heads()), -1);
  for (std::size_t s = 0; s < resolved.layers.size(); ++s) layer_slot[resolved.layers[s]] = static_cast<int>(s);
  for (std::size_t s = 0; s < nh; ++s) head_slot[resolved.heads[s]] = static_cast<int>(s);

  Selection without_v = resolved;  // confusion compares attention weights only: V is not read
  without_v.need_v = false;
  without_v.any_geometry = true;  // layers of another geometry: unit by unit (geometry_heads.hpp)
  const std::vector<char> by_units = layers_by_units(schema, resolved.layers);
  for (int layer : resolved.layers) {
    if (!by_units[static_cast<std::size_t>(layer)]) continue;
    const std::string where = schema.path + ": model layer " +
                              std::to_string(schema.model_layer(layer)) + " (" +
                              schema.geometry(layer).describe() + ")";
    if (opt.exclude.active()) {
      throw UsageError("confusion --exclude-tokens: " + where +
                       " has other tokens than the dump's grid, which the token masks describe; "
                       "select --layers of the dump's grid");
    }
    if (opt.device == Device::Cuda && !reference) {
      throw UsageError("confusion --device cuda: " + where +
                       " is counted window by window on the CPU only; run with --device cpu");
    }
  }
  if (opt.device == Device::Cuda && !reference && !resolved.own_variants.empty()) {
    throw UsageError("confusion --device cuda: " + schema.path +
                     ": its layers differ in family, which the GPU path does not take; give "
                     "--variant, or run with --device cpu");
  }
  auto slot_of = [&](const HeadView& hv) {
    return static_cast<std::size_t>(layer_slot[hv.layer]) * nh + static_cast<std::size_t>(head_slot[hv.head]);
  };
  // Every selected image's excluded tokens, read before the loop (the reader is the loop's once
  // it starts); image_at[image] is the image's place in the selection.
  const std::vector<ExcludedTokens> excluded =
      excluded_tokens(reader, opt.exclude, resolved.images);
  std::vector<int> image_at(static_cast<std::size_t>(schema.num_images), -1);
  for (std::size_t i = 0; i < resolved.images.size(); ++i) {
    image_at[static_cast<std::size_t>(resolved.images[i])] = static_cast<int>(i);
  }
  auto excluded_of = [&](int image) -> const ExcludedTokens* {
    const ExcludedTokens& e =
        excluded[static_cast<std::size_t>(image_at[static_cast<std::size_t>(image)])];
    return e.empty() ? nullptr : &e;
  };
  auto excluded_count_of = [&](int image) {
    const ExcludedTokens* e = excluded_of(image);
    return e == nullptr ? 0 : excluded_count(*e);
  };
  auto count_one = [&](const HeadView& hv, std::size_t vi) {
    const MatF& raw = hv.q_raw ? *hv.q_raw : hv.q;
    const ExcludedTokens* left_out = excluded_of(hv.image);
    const Variant& v = head_variant(variants, vi, hv);
    const double s = head_scale(hv, scale);
    return in_head(hv.image, hv.layer, hv.head, [&] {
      if (by_units[static_cast<std::size_t>(hv.layer)]) {
        return count_confusion_units(v, hv.q, raw, hv.k, s, *hv.geometry, opt);
      }
      return reference ? count_confusion_reference(v, hv.q, raw, hv.k, s, opt, left_out)
                       : count_confusion(v, hv.q, raw, hv.k, s, opt, left_out);
    });
  };

  bool per_head_params = false;  // a family that needs each head's own data takes the per-head path
  for (const Variant& v : variants) per_head_params = per_head_params || v.needs_params();
  for (const Variant& v : resolved.own_variants)
    per_head_params = per_head_params || v.needs_params();
  if (opt.device == Device::Cuda && !reference && per_head_params) {
    throw UsageError(
        "confusion on the GPU takes one variant for a batch of heads; a family that needs each "
        "head's own parameters (AttentionFamily::params) runs on the CPU (--device cpu)");
  }
  if (opt.device == Device::Cuda && !reference) {
    // The GPU takes whole images: every head of up to kCudaImagesPerLaunch images in one batch
    // (count_confusion_cuda_batch groups them by shape and cuts them to the device's memory),
    // while the reader reads ahead twice that many.
    without_v.read_ahead = 2 * kCudaImagesPerLaunch;
    std::deque<ConfusionImage> done;
    for_each_image_batch(
        reader, without_v, kCudaImagesPerLaunch,
        [&](const std::vector<ImageHeads>& images) {
          std::vector<HeadInput> inputs;
          for (const ImageHeads& heads : images) {
            for (const HeadView& hv : heads) {
              inputs.push_back(
                  HeadInput{&hv.q, hv.q_raw ? hv.q_raw : &hv.q, &hv.k, excluded_of(hv.image)});
            }
          }
          std::vector<std::vector<HeadConfusion>> per_variant(nv);
          for (std::size_t vi = 0; vi < nv; ++vi) {
            try {
              per_variant[vi] = count_confusion_cuda_batch(variants[vi], inputs, scale, opt);
            } catch (const NumericalError&) {
              // Which head: the first one whose own count fails says so, naming itself.
              for (const ImageHeads& heads : images) {
                for (const HeadView& hv : heads) count_one(hv, vi);
              }
              throw;
            }
          }
          std::size_t at = 0;
          for (const ImageHeads& heads : images) {
            ConfusionImage img;
            img.image = heads.empty() ? -1 : heads.front().image;
            img.heads.assign(nv, std::vector<HeadConfusion>(slots));
            img.excluded_tokens = heads.empty() ? 0 : excluded_count_of(img.image);
            for (const HeadView& hv : heads) {
              for (std::size_t vi = 0; vi < nv; ++vi) img.heads[vi][slot_of(hv)] = per_variant[vi][at];
              ++at;
            }
            done.push_back(std::move(img));
          }
        },
        [&](int image) {
          if (done.empty() || done.front().image != image) {
            throw Error("confusion: the GPU batch lost track of image " + std::to_string(image));
          }
          sink(std::move(done.front()));
          done.pop_front();
        });
    return;
  }

  // Two images in flight: the threads that find no head left of one start on the next, with no
  // barrier between images; each image's counts go to its own lane of the ring.
  std::vector<ConfusionImage> lane(kImagesInFlight);
  for (ConfusionImage& img : lane) img.heads.assign(nv, std::vector<HeadConfusion>(slots));
  auto on_head = [&](const HeadView& hv, std::size_t at) {
    for (std::size_t vi = 0; vi < nv; ++vi) lane[at].heads[vi][slot_of(hv)] = count_one(hv, vi);
  };
  auto on_image = [&](int image, std::size_t at) {
    ConfusionImage done;
    done.image = image;
    done.heads = lane[at].heads;
    done.excluded_tokens = excluded_count_of(image);
    sink(std::move(done));
  };
  for_each_head_pipelined(reader, without_v, kImagesInFlight, on_head, on_image);
}

ConfusionResult run_confusion(DumpReader& reader, const Selection& resolved,
                              const std::vector<Variant>& variants, const ConfusionOptions& opt,
                              bool reference, const ConfusionImageFn& per_image) {
  ConfusionTotals totals(variants, resolved, reader.schema().attrs.num_tokens);
  confusion_images(reader, resolved, variants, opt, reference, [&](ConfusionImage&& img) {
    const ConfusionImageTotals t = totals.add(img);
    if (per_image) per_image(img.image, t.count, t.degenerate_pairs);
  });
  return totals.result();
}

}  // namespace attnscope::analyses
