// DumpAttributes::variant: the registry object of a dump's own variant (validate_attributes checks
// that it parses).
#include "attnscope/dump.hpp"
#include "attnscope/variant.hpp"

namespace attnscope {

Variant DumpAttributes::variant(std::uint64_t seed) const {
  std::string spec = attention_family;
  if (!feature_map.empty() && feature_map != "none") spec += ":" + feature_map;
  spec += "@" + convention;
  return parse_variant(spec, parse_convention(convention), seed);
}

}  // namespace attnscope
