// DumpAttributes::variant, apart from the reader so that reading a dump does not pull in the
// variant registry.
#include "attnscope/dump.hpp"

namespace attnscope {

Variant DumpAttributes::variant(std::uint64_t seed) const {
  std::string spec = attention_family;
  if (!feature_map.empty() && feature_map != "none") spec += ":" + feature_map;
  spec += "@" + convention;
  return parse_variant(spec, parse_convention(convention), seed);
}

}  // namespace attnscope
