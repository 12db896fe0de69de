// Streaming over a dump: the next image is read on a helper thread while OpenMP threads compute
// the heads of the current one. Only one thread touches the reader at any time, and the two
// images in flight reuse their storage (the model's own attn and out, when asked for, are read
// with their image).
#include "attnscope/analyses/dump_loop.hpp"

#include "attnscope/error.hpp"
#include "attnscope/parallel.hpp"
#include "attnscope/text.hpp"

#include <algorithm>
#include <charconv>
#include <future>
#include <numeric>
#include <optional>
#include <set>

namespace attnscope::analyses {

namespace {

void fill_or_check(std::vector<int>& idx, int count, const char* what) {
  if (idx.empty()) {
    idx.resize(static_cast<std::size_t>(count));
    std::iota(idx.begin(), idx.end(), 0);
    return;
  }
  for (int i : idx) {
    if (count == 0) {
      throw UsageError(std::string(what) + " index " + std::to_string(i) + " out of range: the dump has no " +
                       what + "s");
    }
    if (i < 0 || i >= count) {
      throw UsageError(std::string(what) + " index " + std::to_string(i) + " out of range: the dump has " +
                       std::to_string(count) + " " + what + "s (0-" + std::to_string(count - 1) + ")");
    }
  }
}

int parse_int(std::string_view text, const std::string& flag) {
  int value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) {
    throw UsageError(flag + ": expected an index or a range like 0-9, found '" + std::string(text) + "'");
  }
  return value;
}

/// Applies the selection's transform to every selected head of an image (serially: the
/// transform may draw its parameters lazily).
std::vector<MatF> transform_queries(const ImageQKV& img, const Selection& sel) {
  std::vector<MatF> out;
  if (sel.transform.is_identity()) return out;
  out.reserve(sel.layers.size() * sel.heads.size());
  for (std::size_t slot = 0; slot < sel.layers.size(); ++slot) {
    for (int h : sel.heads) {
      out.push_back(sel.transform.apply<float>(img.Q(static_cast<int>(slot), h)));
    }
  }
  return out;
}

/// One image in flight: its Q, K, V and, when the selection asks for them, the model's own
/// tensors of each selected (layer, head), indexed like ImageQKV::q (empty when not asked for).
struct ImageBuffer {
  ImageQKV qkv;
  std::vector<std::optional<MatF>> attn, out;
};

void read_image(DumpReader& reader, const Selection& sel, int image, ImageBuffer& buf) {
  reader.read_image_into(buf.qkv, image, sel.layers, sel.need_v);
  buf.attn.clear();
  buf.out.clear();
  if (!sel.need_model_tensors) return;
  const DumpSchema& s = reader.schema();
  for (int layer : sel.layers) {
    for (int h = 0; h < s.attrs.num_heads; ++h) {
      const auto l = static_cast<std::size_t>(layer);
      buf.attn.push_back(s.layer_has_attn[l] ? reader.read_attn(image, layer, h) : std::nullopt);
      buf.out.push_back(s.layer_has_out[l] ? reader.read_out(image, layer, h) : std::nullopt);
    }
  }
}

const MatF* model_tensor(const std::vector<std::optional<MatF>>& t, std::size_t index) {
  return index < t.size() && t[index] ? &*t[index] : nullptr;
}

void compute_image(const ImageBuffer& buf, const Selection& sel,
                   const std::function<void(const HeadView&)>& fn) {
  const ImageQKV& img = buf.qkv;
  const std::vector<MatF> transformed = transform_queries(img, sel);
  const int n_heads = static_cast<int>(sel.heads.size());
  const int n_items = static_cast<int>(sel.layers.size()) * n_heads;
  parallel_for(n_items, [&](int item) {
    const int slot = item / n_heads;
    const int head = sel.heads[static_cast<std::size_t>(item % n_heads)];
    const MatF& raw = img.Q(slot, head);
    const MatF& q = transformed.empty() ? raw : transformed[static_cast<std::size_t>(item)];
    const auto stored = static_cast<std::size_t>(slot * img.heads + head);
    const HeadView view{img.image, img.layers[static_cast<std::size_t>(slot)], head, q,
                        img.K(slot, head), img.V(slot, head), &raw,
                        model_tensor(buf.attn, stored), model_tensor(buf.out, stored)};
    fn(view);
  });
}

}  // namespace

Selection resolve(const DumpSchema& schema, Selection sel) {
  fill_or_check(sel.images, schema.num_images, "image");
  fill_or_check(sel.layers, schema.attrs.num_layers, "layer");
  fill_or_check(sel.heads, schema.attrs.num_heads, "head");
  return sel;
}

std::vector<int> parse_index_list(std::string_view spec, const std::string& flag) {
  std::vector<int> out;
  if (spec.empty()) return out;
  std::set<int> seen;
  for (const std::string_view item : split_list(spec)) {  // an empty item (trailing comma) too
    const std::size_t dash = item.find('-', 1);
    const int lo = parse_int(item.substr(0, dash), flag);
    const int hi = dash == std::string_view::npos ? lo : parse_int(item.substr(dash + 1), flag);
    if (lo < 0 || hi < lo) {
      throw UsageError(flag + ": expected a non-negative index or an increasing range, found '" +
                       std::string(item) + "'");
    }
    for (int i = lo; i <= hi; ++i) {
      // A repeated index would give repeated rows in every result.
      if (!seen.insert(i).second) {
        throw UsageError(flag + ": index " + std::to_string(i) + " is listed twice in '" +
                         std::string(spec) + "'");
      }
      out.push_back(i);
    }
  }
  return out;
}

void for_each_head(DumpReader& reader, const Selection& resolved,
                   const std::function<void(const HeadView&)>& fn,
                   const std::function<void(int image)>& on_image) {
  if (resolved.images.empty()) return;
  // Two images in flight, their storage reused: the reader fills one while the other is
  // computed, so no matrix is allocated (and page-faulted in) again after the first two images.
  ImageBuffer buffers[2];
  auto read = [&reader, &resolved, &buffers](std::size_t slot, int image) {
    read_image(reader, resolved, image, buffers[slot]);
  };
  std::future<void> next =
      std::async(std::launch::async, read, std::size_t{0}, resolved.images.front());
  for (std::size_t n = 0; n < resolved.images.size(); ++n) {
    next.get();
    const ImageBuffer& buf = buffers[n % 2];
    if (n + 1 < resolved.images.size()) {
      next = std::async(std::launch::async, read, (n + 1) % 2, resolved.images[n + 1]);
    }
    compute_image(buf, resolved, fn);
    if (on_image) on_image(buf.qkv.image);
  }
}

}  // namespace attnscope::analyses
