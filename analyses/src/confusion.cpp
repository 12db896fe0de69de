// Confusion counting: the exact pair judge, the per-head entry points and the streaming driver.
#include "attnscope/analyses/confusion.hpp"

#include "attnscope/error.hpp"
#include "confusion_search.hpp"

#include <mutex>

namespace attnscope::analyses {

namespace detail {

PairJudge::PairJudge(const ExactRows& rows, const MatF& q_raw, const ConfusionOptions& opt)
    : rows_(rows),
      q_raw_(q_raw.cast<double>()),
      eps_(opt.eps),
      eps2_(opt.eps * opt.eps),
      query_eps2_(opt.query_eps * opt.query_eps),
      cache_(static_cast<std::size_t>(rows.tokens())) {
  if (q_raw.rows() != rows.tokens()) throw UsageError("confusion: raw queries do not match the head");
}

bool PairJudge::queries_differ(int i, int j) const {
  return squared_distance(q_raw_.row(i).data(), q_raw_.row(j).data(), static_cast<int>(q_raw_.cols())) >
         query_eps2_;
}

bool PairJudge::rows_within(int i, int j) {
  return squared_distance(cached_row(i), cached_row(j), rows_.tokens()) <= eps2_;
}

const double* PairJudge::cached_row(int i) {
  auto& r = cache_[static_cast<std::size_t>(i)];
  if (r.empty()) {
    r.resize(static_cast<std::size_t>(rows_.tokens()));
    rows_.row(i, r.data());
  }
  return r.data();
}

}  // namespace detail

HeadConfusion count_confusion(const Variant& v, const MatF& q, const MatF& q_raw, const MatF& k,
                              double scale, const ConfusionOptions& opt) {
  const ExactRows rows(v, q, k, scale);
  detail::PairJudge judge(rows, q_raw, opt);
  HeadConfusion out = v.family == Family::Softmax ? detail::search_softmax(q, k, scale, judge)
                                                  : detail::search_low_rank(rows, judge);
  out.degenerate_rows = rows.degenerate_count();
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

ConfusionResult run_confusion(DumpReader& reader, const Selection& resolved,
                              const std::vector<Variant>& variants, const ConfusionOptions& opt,
                              bool reference, const ConfusionImageFn& per_image) {
  const DumpSchema& schema = reader.schema();
  const double scale = schema.attrs.scale;
  const std::size_t nv = variants.size(), nh = resolved.heads.size();
  const std::size_t slots = resolved.layers.size() * nh;
  ConfusionResult res;
  res.variants = variants;
  res.per_head.assign(nv, std::vector<ConfusionHeadTotal>(slots));
  res.histogram.assign(nv, {});
  for (auto& heads : res.per_head) {
    for (std::size_t s = 0; s < slots; ++s) {
      heads[s].layer = resolved.layers[s / nh];
      heads[s].head = resolved.heads[s % nh];
    }
  }
  // Slot of a (layer, head) in the per-head tables.
  std::vector<int> layer_slot(static_cast<std::size_t>(schema.attrs.num_layers), -1);
  std::vector<int> head_slot(static_cast<std::size_t>(schema.attrs.num_heads), -1);
  for (std::size_t s = 0; s < resolved.layers.size(); ++s) layer_slot[resolved.layers[s]] = static_cast<int>(s);
  for (std::size_t s = 0; s < nh; ++s) head_slot[resolved.heads[s]] = static_cast<int>(s);

  std::vector<std::vector<HeadConfusion>> image_heads(nv, std::vector<HeadConfusion>(slots));
  auto on_head = [&](const HeadView& hv) {
    const std::size_t s = static_cast<std::size_t>(layer_slot[hv.layer]) * nh +
                          static_cast<std::size_t>(head_slot[hv.head]);
    const MatF& raw = hv.q_raw ? *hv.q_raw : hv.q;
    for (std::size_t vi = 0; vi < nv; ++vi) {
      image_heads[vi][s] = reference ? count_confusion_reference(variants[vi], hv.q, raw, hv.k, scale, opt)
                                     : count_confusion(variants[vi], hv.q, raw, hv.k, scale, opt);
    }
  };
  auto on_image = [&](int image) {
    std::vector<std::int64_t> totals(nv, 0);
    for (std::size_t vi = 0; vi < nv; ++vi) {
      for (std::size_t s = 0; s < slots; ++s) {
        const HeadConfusion& h = image_heads[vi][s];
        totals[vi] += h.pairs;
        res.per_head[vi][s].count += h.pairs;
        res.per_head[vi][s].degenerate_rows += h.degenerate_rows;
        res.candidates += h.candidates;
      }
      ++res.histogram[vi][static_cast<std::size_t>(confusion_bin(totals[vi]))];
    }
    ++res.images;
    if (per_image) per_image(image, totals);
  };
  Selection without_v = resolved;  // confusion compares attention weights only: V is not read
  without_v.need_v = false;
  for_each_head(reader, without_v, on_head, on_image);
  return res;
}

}  // namespace attnscope::analyses
