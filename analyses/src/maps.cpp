// Attention maps: one row of a head laid out on the patch grid.
#include "attnscope/analyses/maps.hpp"

#include "attnscope/analyses/geometry_heads.hpp"
#include "attnscope/analyses/head_error.hpp"
#include "attnscope/error.hpp"
#include "attnscope/text.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <mutex>
#include <tuple>
#include <utility>

namespace attnscope::analyses {

namespace {

int parse_number(std::string_view text, std::string_view item) {
  int value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) {
    throw UsageError("--tokens: expected an index or ROW:COL, found '" + std::string(item) + "'");
  }
  return value;
}

}  // namespace

AttentionMap attention_map(const ExactRows& rows, const TokenGrid& grid, int token) {
  if (token < 0 || token >= grid.tokens() || rows.tokens() != grid.tokens()) {
    throw UsageError("attention map: token " + std::to_string(token) + " is not one of the " +
                     std::to_string(grid.tokens()) + " tokens");
  }
  const VecD w = rows.row(token);
  AttentionMap m;
  m.token = token;
  if (grid.on_grid(token)) {
    m.query_row = grid.row(token);
    m.query_col = grid.col(token);
  }
  m.grid.resize(grid.height, grid.width);
  for (int r = 0; r < grid.height; ++r) {
    for (int c = 0; c < grid.width; ++c) m.grid(r, c) = w(grid.token(r, c));
  }
  m.prefix.assign(w.data(), w.data() + grid.prefix);
  return m;
}

void maps_images(DumpReader& reader, const Selection& resolved, const std::vector<Variant>& variants,
                 const std::vector<int>& tokens, const std::function<void(MapsImage&&)>& sink) {
  const DumpSchema& schema = reader.schema();
  Selection sel = resolved;
  sel.need_v = false;  // maps are weights only
  sel.any_geometry = true;  // layers of another geometry: the query's window or reduced keys
  const std::vector<char> by_units = layers_by_units(schema, resolved.layers);
  std::vector<MapEntry> pending;
  std::mutex pending_mutex;
  std::atomic<long long> degenerate{0};
  auto on_head = [&](const HeadView& hv) {
    for (std::size_t v = 0; v < variants.size(); ++v) {
      const Variant& variant = head_variant(variants, v, hv);
      const double scale = head_scale(hv, schema.attrs.scale);
      if (by_units[static_cast<std::size_t>(hv.layer)]) {
        for (int t : tokens) {
          std::optional<AttentionMap> m = in_head(hv.image, hv.layer, hv.head, [&] {
            return attention_map_units(variant, hv.q, hv.k, scale, *hv.geometry, schema.attrs.grid,
                                       t, schema.model_layer(hv.layer));
          });
          if (!m) {
            degenerate.fetch_add(1);
            continue;
          }
          MapEntry e{v, hv.image, hv.layer, hv.head, std::move(*m)};
          const std::lock_guard<std::mutex> lock(pending_mutex);
          pending.push_back(std::move(e));
        }
        continue;
      }
      const ExactRows rows = in_head(hv.image, hv.layer, hv.head, [&] {
        return ExactRows(variant, hv.q, hv.k, scale);
      });
      for (int t : tokens) {
        if (rows.degenerate(t)) {
          degenerate.fetch_add(1);
          continue;
        }
        MapEntry e{v, hv.image, hv.layer, hv.head, attention_map(rows, schema.attrs.grid, t)};
        const std::lock_guard<std::mutex> lock(pending_mutex);
        pending.push_back(std::move(e));
      }
    }
  };
  // Every head of an image is done when image_done runs (for_each_head), so the counter holds
  // exactly that image's degenerate rows.
  auto image_done = [&](int image) {
    const auto key = [&schema](const MapEntry& e) {
      return std::make_tuple(e.variant, schema.model_layer(e.layer), e.head, e.map.token);
    };
    std::sort(pending.begin(), pending.end(),
              [&key](const MapEntry& a, const MapEntry& b) { return key(a) < key(b); });
    MapsImage done;
    done.image = image;
    done.maps = std::exchange(pending, {});
    done.degenerate_rows = degenerate.exchange(0);
    sink(std::move(done));
  };
  for_each_head(reader, sel, on_head, image_done);
}

MapsRun run_maps(DumpReader& reader, const Selection& resolved,
                 const std::vector<Variant>& variants, const std::vector<int>& tokens,
                 const std::function<void(int image, const std::vector<MapEntry>& maps)>&
                     on_image) {
  MapsRun run;
  maps_images(reader, resolved, variants, tokens, [&](MapsImage&& img) {
    on_image(img.image, img.maps);
    run.maps += static_cast<long long>(img.maps.size());
    run.degenerate_rows += img.degenerate_rows;
  });
  return run;
}

std::vector<int> parse_tokens(std::string_view spec, const TokenGrid& grid) {
  std::vector<int> out;
  for (const std::string_view item : split_list(spec)) {
    const std::size_t colon = item.find(':');
    int token = 0;
    if (colon == std::string_view::npos) {
      token = parse_number(item, item);
    } else {
      const int r = parse_number(item.substr(0, colon), item), c = parse_number(item.substr(colon + 1), item);
      if (r < 0 || r >= grid.height || c < 0 || c >= grid.width) {
        throw UsageError("--tokens: cell " + std::string(item) + " is outside the " + std::to_string(grid.height) +
                         "x" + std::to_string(grid.width) + " grid");
      }
      token = grid.token(r, c);
    }
    if (token < 0 || token >= grid.tokens()) {
      throw UsageError("--tokens: token " + std::to_string(token) + " out of range (0-" +
                       std::to_string(grid.tokens() - 1) + ")");
    }
    // A token named twice (also as an index and as a cell) would repeat its map in every result.
    if (std::find(out.begin(), out.end(), token) != out.end()) {
      throw UsageError("--tokens: token " + std::to_string(token) + " is listed twice (again as '" +
                       std::string(item) + "')");
    }
    out.push_back(token);
  }
  return out;
}

}  // namespace attnscope::analyses
