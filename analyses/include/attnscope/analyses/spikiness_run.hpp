// A spikiness run over many queries (spikiness.hpp): where the heads come from (a dump, or the
// synthetic model of synth.hpp), the sweep of the sampled queries as their heads arrive, and the
// medians over queries that summarise it.
#pragma once

#include "attnscope/analyses/dump_loop.hpp"
#include "attnscope/analyses/spikiness.hpp"
#include "attnscope/dump.hpp"
#include "attnscope/variant.hpp"
#include "attnscope/synth.hpp"

#include <functional>
#include <string>
#include <vector>

namespace attnscope::analyses {

/// The heads a sweep reads: a dump streamed by for_each_head, or synthetic heads computed image by
/// image. A synthetic source describes its model as a dump's schema would (path "synthetic", the
/// attributes of its SynthOptions, neither attn nor out in any layer).
class HeadSource {
 public:
  using HeadFn = std::function<void(const HeadView&)>;
  using ImageFn = std::function<void(int image)>;

  /// The dump `reader` reads; the reader must outlive the source.
  [[nodiscard]] static HeadSource dump(DumpReader& reader);
  /// The synthetic model of `options` (validated by the caller).
  [[nodiscard]] static HeadSource synthetic(const SynthOptions& options);

  [[nodiscard]] const std::string& name() const { return name_; }  ///< "dump" or "synthetic"
  [[nodiscard]] const DumpSchema& schema() const { return schema_; }
  /// Calls fn for every (image, layer, head) of a resolved selection, images in order, and
  /// on_image after each image (as for_each_head does for a dump).
  void for_each_head(const Selection& resolved, const HeadFn& fn,
                     const ImageFn& on_image = {}) const;

 private:
  std::string name_;
  DumpSchema schema_;
  std::function<void(const Selection&, const HeadFn&, const ImageFn&)> loop_;
};

/// The images that hold at least one of the samples, ascending: the only ones a run reads.
[[nodiscard]] std::vector<int> sample_images(const std::vector<QuerySample>& samples);

/// Sweeps every sample query for every variant. Reads only the images holding a sample, and only
/// their Q and K; `keep_weights` as for SpikinessCollector. on_image runs after each image read.
[[nodiscard]] SpikinessResult run_spikiness(const HeadSource& source, const Selection& resolved,
                                            std::vector<Variant> variants,
                                            std::vector<QuerySample> samples,
                                            const SpikinessOptions& options, int keep_weights,
                                            const HeadSource::ImageFn& on_image = {});

/// The per-image form of run_spikiness: sweeps the samples of `images` (images holding samples,
/// ascending; a part of sample_images(samples)) and hands each image's part to `sink` after the
/// image. A SpikinessCollector over the same variants and samples that add_image()s every part
/// in order finishes with run_spikiness's result. keep_weights counts from the run's first sample.
void spikiness_images(const HeadSource& source, const Selection& resolved,
                      const std::vector<Variant>& variants, const std::vector<QuerySample>& samples,
                      const SpikinessOptions& options, int keep_weights,
                      const std::vector<int>& images,
                      const std::function<void(SpikinessImage&&)>& sink);

/// Whether any point of any sweep has a ratio (not NaN): false when every sampled row is
/// degenerate at every scale, and there is nothing to report.
[[nodiscard]] bool has_ratio(const SpikinessResult& r);

/// The median of the values that are not NaN; NaN when there is none.
[[nodiscard]] double median_ignoring_nan(std::vector<double> x);

/// Medians over the samples at one scale of the sweep.
struct ScaleMedians {
  double scale = 0.0;           ///< the factor a (0 when the run has no sample)
  double ratio = 0.0;           ///< median ratio (NaN when no sample has one)
  double effective_keys = 0.0;  ///< median effective keys (NaN when no sample has one)
};
/// Per variant (in r.variants order), per scale (the first `scales` of each sweep).
[[nodiscard]] std::vector<std::vector<ScaleMedians>> spikiness_medians(const SpikinessResult& r,
                                                                       std::size_t scales);

}  // namespace attnscope::analyses
