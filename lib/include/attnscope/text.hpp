// Comma-separated lists on the command line (--variant, --images, --mask, --intervention, ...):
// one way to split them, so that every flag sees the same items.
#pragma once

#include <string_view>
#include <vector>

namespace attnscope {

/// The items of a comma-separated list, in order, empty ones included: "a,,b" gives a, "", b;
/// "a," gives a, ""; "" gives one empty item. Items are not trimmed.
inline std::vector<std::string_view> split_list(std::string_view list) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = list.find(',', start);
    out.push_back(list.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (comma == std::string_view::npos) return out;
    start = comma + 1;
  }
}

}  // namespace attnscope
