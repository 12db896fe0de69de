#include "live.hpp"

#include "bindings.hpp"

#include "attnscope/run/query_stats_files.hpp"
#include "attnscope/run/result_files.hpp"
#include "attnscope/run/result_set.hpp"
#include "attnscope/run/run_record.hpp"

#include "attnscope/analyses/entropy.hpp"
#include "attnscope/analyses/head_error.hpp"
#include "attnscope/error.hpp"

#include <cmath>
#include <filesystem>

namespace attnscope::python {

namespace {

/// The selection the totals are laid out for: the analysed layers as dump layers 0..L-1.
analyses::Selection selection_of(const LiveSetup& s) {
  analyses::Selection sel = one_layer(s.heads);
  sel.layers.clear();
  for (std::size_t l = 0; l < s.model_layers.size(); ++l) sel.layers.push_back(static_cast<int>(l));
  return sel;
}

/// One head of a batch as the per-head work sees it.
struct BatchHead {
  Eigen::Index image;    ///< index in the batch
  Eigen::Index slot;     ///< layer slot * heads + head
  Eigen::Index variant;  ///< index into the setup's variants
  int layer_slot, head;
  const MatF& q;
  const MatF& k;
  const MatF& v;     ///< empty where the batch brings no v
  const MatF* out;   ///< null where the batch brings no out
};

/// Image parts of a batch, [image][variant][slot] of Head each, images numbered from `first`,
/// filled by fn(BatchHead) for every (image, layer, head, variant) in parallel (OpenMP, the GIL
/// released); a NumericalError names the image (counted from the first batch), the model's layer
/// and the head.
template <typename Image, typename Head, typename Fn>
std::vector<Image> batch_parts(const LiveSetup& s, const LiveBatch& b, std::int64_t first,
                               Fn&& fn) {
  const std::vector<Heads<float>>& q = b.q;
  const std::vector<Heads<float>>& k = b.k;
  const Eigen::Index images = q[0].images(), heads = s.heads;
  const auto layers = static_cast<Eigen::Index>(q.size());
  const auto nv = static_cast<Eigen::Index>(s.variants.size());
  std::vector<Image> parts(static_cast<std::size_t>(images));
  for (Eigen::Index i = 0; i < images; ++i) {
    parts[static_cast<std::size_t>(i)].image = static_cast<int>(first + i);
    parts[static_cast<std::size_t>(i)].heads.assign(
        static_cast<std::size_t>(nv), std::vector<Head>(static_cast<std::size_t>(layers * heads)));
  }
  for_each_index(images * layers * heads * nv, [&](Eigen::Index t) {
    const Eigen::Index vi = t % nv, h = t / nv % heads, l = t / nv / heads % layers,
                       i = t / nv / heads / layers;
    const MatF qh = q[static_cast<std::size_t>(l)].head(i * heads + h);
    const MatF kh = k[static_cast<std::size_t>(l)].head(i * heads + h);
    const MatF vh = b.v.empty() ? MatF() : MatF(b.v[static_cast<std::size_t>(l)].head(i * heads + h));
    const MatF oh = b.out.empty() ? MatF()
                                  : MatF(b.out[static_cast<std::size_t>(l)].head(i * heads + h));
    const BatchHead bh{i,  l * heads + h, vi, static_cast<int>(l), static_cast<int>(h),
                       qh, kh, vh, b.out.empty() ? nullptr : &oh};
    parts[static_cast<std::size_t>(i)]
        .heads[static_cast<std::size_t>(vi)][static_cast<std::size_t>(bh.slot)] =
        analyses::in_head(static_cast<int>(first + i), s.model_layers[static_cast<std::size_t>(l)],
                          bh.head, [&] { return fn(bh); });
  });
  return parts;
}

}  // namespace

std::filesystem::path LiveAnalysis::results_folder() const {
  if (out_dir_.empty()) throw UsageError("out: no results folder was given to publish into");
  return run::ensure_out_dir(out_dir_);
}

void LiveAnalysis::check_batch(const LiveSetup& s, const LiveBatch& b) const {
  const std::vector<Heads<float>>& q = b.q;
  const std::vector<Heads<float>>& k = b.k;
  if (q.size() != s.model_layers.size() || k.size() != q.size()) {
    throw UsageError("a batch brings " + std::to_string(q.size()) + " layers of q and " +
                     std::to_string(k.size()) + " of k, expected " +
                     std::to_string(s.model_layers.size()));
  }
  for (std::size_t l = 0; l < q.size(); ++l) {
    require_same_heads(q[0], q[l], true);
    require_same_heads(q[0], k[l], true);
  }
  for (const auto* extra : {&b.v, &b.out}) {
    if (extra->empty()) continue;
    if (extra->size() != q.size()) {
      throw UsageError("a batch brings " + std::to_string(extra->size()) + " layers of " +
                       extra->front().name() + ", expected " + std::to_string(q.size()));
    }
    for (const auto& x : *extra) require_same_heads(q[0], x, false);
  }
  if (needs_v() && b.v.empty()) throw UsageError("this analysis needs v, the values");
  if (q[0].heads() != s.heads || q[0].tokens() != s.grid.tokens()) {
    throw UsageError("a batch has " + std::to_string(q[0].heads()) + " heads of " +
                     std::to_string(q[0].tokens()) + " tokens, expected " +
                     std::to_string(s.heads) + " of " + std::to_string(s.grid.tokens()));
  }
}

LiveLocality::LiveLocality(LiveSetup setup, int window, std::string out_dir)
    : setup_(std::move(setup)),
      window_(window),
      totals_(setup_.variants, selection_of(setup_), setup_.grid, window) {
  if (window < 1 || window % 2 == 0) {
    throw UsageError("window must be a positive odd number, found " + std::to_string(window));
  }
  out_dir_ = std::move(out_dir);
}

void LiveLocality::add(const LiveBatch& b) {
  check_batch(setup_, b);
  const std::vector<Heads<float>>& q = b.q;
  // Every (image, layer, head, variant) of the batch at once; then the images folded in order.
  const auto parts = batch_parts<analyses::LocalityImage, analyses::LocalityHead>(
      setup_, b, images_, [&](const BatchHead& bh) {
        analyses::LocalityHead part;
        int degenerate = 0;
        part.mass = analyses::mass_stats(
            analyses::local_mass(setup_.variants[static_cast<std::size_t>(bh.variant)], bh.q, bh.k,
                                 setup_.scale, setup_.grid, window_, &degenerate));
        part.layer = bh.layer_slot;
        part.head = bh.head;
        part.degenerate_rows = degenerate;
        return part;
      });
  for (const auto& img : parts) totals_.add(img);
  images_ += q[0].images();
}

analyses::LocalityResult LiveLocality::result() const {
  analyses::LocalityResult r = totals_.result();
  for (auto& heads : r.per_head) {
    for (auto& h : heads) h.layer = setup_.model_layers[static_cast<std::size_t>(h.layer)];
  }
  return r;
}

std::string LiveLocality::publish(nlohmann::json record) {
  const analyses::LocalityResult r = result();
  run::ResultSet set(results_folder(), "locality.json");
  run::write_locality_files(set, r);
  record["results"]["images"] = r.images;
  record["results"]["uniform_baseline"] = r.uniform_baseline;
  return set.publish(std::move(record)).string();
}

namespace {

/// sum_tol as the census takes it, finite and >= 0, named as Python names it (the collector's
/// own check names the command's flag).
double checked_sum_tolerance(double tol) {
  if (!(tol >= 0.0) || !std::isfinite(tol)) {
    throw UsageError("sum_tol: expected a finite tolerance >= 0, found " + std::to_string(tol));
  }
  return tol;
}

}  // namespace

LiveCensus::LiveCensus(LiveSetup setup, double sum_tolerance, std::string out_dir)
    : setup_(std::move(setup)),
      collector_(setup_.variants, selection_of(setup_), setup_.scale,
                 checked_sum_tolerance(sum_tolerance)) {
  out_dir_ = std::move(out_dir);
}

void LiveCensus::add(const LiveBatch& b) {
  check_batch(setup_, b);
  const std::vector<Heads<float>>& q = b.q;
  const std::vector<Heads<float>>& k = b.k;
  const Eigen::Index images = q[0].images(), heads = setup_.heads;
  const auto layers = static_cast<Eigen::Index>(q.size());
  const MatF no_values;
  // Every count is a sum, a minimum or a maximum: the heads may arrive in any order.
  for_each_index(images * layers * heads, [&](Eigen::Index t) {
    const Eigen::Index h = t % heads, l = t / heads % layers, i = t / heads / layers;
    const MatF qh = q[static_cast<std::size_t>(l)].head(i * heads + h);
    const MatF kh = k[static_cast<std::size_t>(l)].head(i * heads + h);
    collector_.add_head(analyses::HeadView{static_cast<int>(images_ + i), static_cast<int>(l),
                                           static_cast<int>(h), qh, kh, no_values});
  });
  images_ += images;
}

std::vector<analyses::CensusCell> LiveCensus::cells() const {
  std::vector<analyses::CensusCell> cells = collector_.cells();
  for (auto& c : cells) c.layer = setup_.model_layers[static_cast<std::size_t>(c.layer)];
  return cells;
}

std::string LiveCensus::publish(nlohmann::json record) {
  run::ResultSet set(results_folder(), "census.json");
  const auto totals = run::write_census_files(set, setup_.variants, cells());
  record["results"]["totals"] = run::census_totals_json(totals);
  return set.publish(std::move(record)).string();
}

LiveConfusion::LiveConfusion(LiveSetup setup, analyses::ConfusionOptions opt, std::string out_dir)
    : setup_(std::move(setup)),
      opt_(opt),
      totals_(setup_.variants, selection_of(setup_), setup_.grid.tokens()) {
  out_dir_ = std::move(out_dir);
  set_ = std::make_unique<run::ResultSet>(results_folder(), "confusion.json");
  files_ =
      std::make_unique<run::ConfusionFiles>(*set_, setup_.variants, setup_.model_layers, false);
}

void LiveConfusion::add(const LiveBatch& b) {
  check_batch(setup_, b);
  const std::vector<Heads<float>>& q = b.q;
  const auto parts = batch_parts<analyses::ConfusionImage, analyses::HeadConfusion>(
      setup_, b, images_, [&](const BatchHead& bh) {
        return analyses::count_confusion(setup_.variants[static_cast<std::size_t>(bh.variant)],
                                         bh.q, bh.q, bh.k, setup_.scale, opt_);
      });
  for (const auto& img : parts) files_->add_image(img, totals_.add(img));
  images_ += q[0].images();
}

std::string LiveConfusion::publish(nlohmann::json record) {
  analyses::ConfusionResult r = totals_.result();
  for (auto& heads : r.per_head) {
    for (auto& h : heads) h.layer = setup_.model_layers[static_cast<std::size_t>(h.layer)];
  }
  for (auto& per_layer : r.per_layer) {
    for (auto& l : per_layer) l.layer = setup_.model_layers[static_cast<std::size_t>(l.layer)];
  }
  files_->finish(r);
  record["results"]["images"] = r.images;
  record["results"]["candidates"] = r.candidates;
  return set_->publish(std::move(record)).string();
}

LiveQueryStats::LiveQueryStats(LiveSetup setup, std::string analysis,
                               const pybind11::dict& options, std::string out_dir)
    : setup_(std::move(setup)),
      analysis_(std::move(analysis)),
      totals_(setup_.variants, selection_of(setup_), {}) {
  pyb::dict opt;  // a copy: the caller's options stay as given
  for (const auto& [key, value] : options) opt[key] = value;
  if (analysis_ == "distance") {
    opt["grid"] = std::vector<int>{setup_.grid.prefix, setup_.grid.height, setup_.grid.width};
    if (options.contains("patch_size")) patch_ = options["patch_size"].cast<double>();
    if (!(patch_ > 0.0)) {
      throw UsageError("patch_size: expected a positive size in pixels, found " +
                       std::to_string(patch_));
    }
    if (options.contains("renormalise")) renormalise_ = options["renormalise"].cast<bool>();
  }
  QueryMeasure m = query_measure(analysis_, opt, setup_.grid.tokens(), setup_.scale, false);
  layout_ = m.layout;
  measure_ = std::move(m.fn);
  need_v_ = m.need_v;
  totals_ = analyses::QueryStatsTotals(setup_.variants, selection_of(setup_), layout_);
  out_dir_ = std::move(out_dir);
}

void LiveQueryStats::add(const LiveBatch& b) {
  check_batch(setup_, b);
  // Every (image, layer, head, variant) of the batch at once; then each image's heads folded into
  // its cells, and the images into the totals in order, as the command folds a dump's.
  struct Image {
    int image = 0;
    std::vector<std::vector<analyses::HeadQueryValues>> heads;  // [variant][slot]
  };
  const auto parts = batch_parts<Image, analyses::HeadQueryValues>(
      setup_, b, images_, [&](const BatchHead& bh) {
        const analyses::HeadView hv{static_cast<int>(images_ + bh.image), bh.layer_slot, bh.head,
                                    bh.q, bh.k, bh.v, &bh.q, nullptr, bh.out};
        return measure_(setup_.variants[static_cast<std::size_t>(bh.variant)], hv);
      });
  const auto empty = analyses::labelled_cells(setup_.variants.size(), selection_of(setup_), layout_);
  for (const auto& part : parts) {
    analyses::QueryStatsImage img;
    img.image = part.image;
    img.cells = empty;
    for (std::size_t vi = 0; vi < part.heads.size(); ++vi) {
      for (std::size_t s = 0; s < part.heads[vi].size(); ++s) {
        analyses::fold_head(layout_, part.heads[vi][s], img.cells[vi][s]);
      }
    }
    totals_.add(img);
  }
  images_ += b.q[0].images();
}

analyses::QueryStatsResult LiveQueryStats::result() const {
  analyses::QueryStatsResult r = totals_.result();
  for (auto& cells : r.cells) {
    for (auto& c : cells) c.layer = setup_.model_layers[static_cast<std::size_t>(c.layer)];
  }
  return r;
}

std::string LiveQueryStats::publish(nlohmann::json record) {
  const analyses::QueryStatsResult r = result();
  const int tokens = setup_.grid.tokens();
  if (analysis_ == "rank" ? run::rank_measured_rows(r, tokens) == 0 : totals_.measured() == 0) {
    throw NumericalError(
        "no valid queries: every attention row of the selection is degenerate (a zero or tiny "
        "denominator), so there is no " + std::string(analysis_ == "rank" ? "matrix" : analysis_) +
        " to measure");
  }
  run::ResultSet set(results_folder(), analysis_ + ".json");
  nlohmann::json results;
  if (analysis_ == "entropy") {
    const double log_n = analyses::max_entropy(tokens);
    run::write_entropy_files(set, r);
    results = run::entropy_results(r, log_n);
  } else if (analysis_ == "distance") {
    const analyses::PatchGeometry geometry(setup_.grid, patch_, patch_);
    run::write_distance_files(set, r);
    results = run::distance_results(r, geometry, renormalise_);
  } else {
    run::write_rank_files(set, r);
    results = run::rank_results(r);
  }
  record["results"].update(results);
  return set.publish(std::move(record)).string();
}

}  // namespace attnscope::python
