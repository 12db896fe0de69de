// Streaming over a dump: images are read on one thread (HDF5 is not thread-safe), heads are
// computed in parallel with OpenMP. Memory is bounded by a few images, whatever the dump's size.
#pragma once

#include "attnscope/dump.hpp"
#include "attnscope/query_transform.hpp"

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace attnscope::analyses {

/// Which part of a dump an analysis reads.
struct Selection {
  std::vector<int> images;  ///< empty: all images
  std::vector<int> layers;  ///< empty: all layers
  std::vector<int> heads;   ///< empty: all heads
  QueryTransform transform;  ///< applied to every Q before any family (default: none)
  /// Whether the analysis uses V. When false the V datasets are not read and HeadView::v refers
  /// to an empty (0 x 0) matrix.
  bool need_v = true;
  /// Whether the analysis uses the model's own tensors: each selected layer's `attn` and `out`
  /// are then read too, where the dump holds them (HeadView::attn, HeadView::out).
  bool need_model_tensors = false;
};

/// One (image, layer, head) work item. q already has the selection's transform applied.
struct HeadView {
  int image = 0;
  int layer = 0;  ///< the dump's layer index
  int head = 0;
  const MatF& q;
  const MatF& k;
  const MatF& v;
  /// The queries as read from the dump, before the selection's transform (== &q when the
  /// transform is none). Analyses that ask whether two queries differ use these.
  const MatF* q_raw = nullptr;
  /// The model's own weights (N x N) and output (N x head_dim) of this head, when the selection
  /// asks for them and the dump holds them; null otherwise.
  const MatF* attn = nullptr;
  const MatF* out = nullptr;
};

/// Resolves the selection against the dump (empty lists become everything) and validates the
/// indices (UsageError naming the bad one).
Selection resolve(const DumpSchema& schema, Selection sel);

/// Calls fn for every selected (image, layer, head), heads of an image in parallel (fn must be
/// thread-safe), images in order. The next image is read while the current one is computed.
/// on_image(image) runs on the calling thread after each image is done (progress, flushing).
void for_each_head(DumpReader& reader, const Selection& resolved,
                   const std::function<void(const HeadView&)>& fn,
                   const std::function<void(int image)>& on_image = {});

/// Parses an index list such as "0-9,15,20-22" (ranges inclusive, order kept). Throws UsageError
/// naming `flag` on malformed text (an empty item included) and on an index listed twice. An
/// empty spec gives an empty list (the flag was not given).
std::vector<int> parse_index_list(std::string_view spec, const std::string& flag);

}  // namespace attnscope::analyses
