// The local term's share of a layer's attention output (local_share.hpp).
#include "attnscope/analyses/local_share.hpp"

#include <cmath>

namespace attnscope::analyses {

std::vector<LocalShareHead> local_share(DumpReader& reader, const Selection& selection) {
  const DumpSchema& s = reader.schema();
  const Selection sel = resolve(s, selection);
  std::vector<LocalShareHead> out;
  for (int layer : sel.layers) {
    const auto l = static_cast<std::size_t>(layer);
    if (!s.layer_has_local[l] || !s.layer_has_out[l]) continue;
    const LayerGeometry geo = s.geometry(layer);  // the grid rows: all but the prefix tokens
    const int grid_tokens = geo.query_rows() - (geo.windows > 0 ? 0 : geo.grid.prefix);
    for (int head : sel.heads) {
      if (head >= geo.num_heads) continue;
      LocalShareHead h;
      h.layer = layer;
      h.head = head;
      for (int image : sel.images) {
        const MatF wv = *reader.read_out(image, layer, head);
        const MatF local = *reader.read_local(image, layer, head);
        const double a = local.bottomRows(grid_tokens).cast<double>().norm();
        const double b = wv.bottomRows(grid_tokens).cast<double>().norm();
        if (a + b > 0) h.share.add(a / (a + b));
      }
      out.push_back(h);
    }
  }
  return out;
}

}  // namespace attnscope::analyses
