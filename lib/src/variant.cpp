// Variant specs (variant.hpp): parsing against the family registry and the table of conventions.
#include "attnscope/variant.hpp"

#include "attnscope/error.hpp"
#include "attnscope/text.hpp"

#include <array>
#include <cmath>
#include <optional>
#include <string>

namespace attnscope {
namespace {

struct ConventionEntry {
  std::string_view name;
  Convention convention;
};
constexpr std::array<ConventionEntry, 3> kConventions{{{"paper", Convention::Paper},
                                                       {"code", Convention::Code},
                                                       {"code+rope", Convention::CodeRope}}};

template <typename Table>
std::string names_of(const Table& table) {
  std::string out;
  for (const auto& e : table) {
    if (!out.empty()) out += ", ";
    out += e.name;
  }
  return out;
}

std::string_view trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  const auto last = s.find_last_not_of(" \t");
  return s.substr(first, last - first + 1);
}

[[noreturn]] void bad_spec(std::string_view spec, const std::string& why) {
  throw UsageError("variant '" + std::string(spec) + "': " + why);
}

}  // namespace

std::optional<Convention> find_convention(std::string_view s) {
  for (const auto& e : kConventions) {
    if (e.name == s) return e.convention;
  }
  return std::nullopt;
}

std::string convention_names() {
  std::string out;
  for (std::size_t i = 0; i < kConventions.size(); ++i) {
    if (i > 0) out += i + 1 == kConventions.size() ? " or " : ", ";
    out += kConventions[i].name;
  }
  return out;
}

std::string to_string(Convention c) {
  for (const auto& e : kConventions) {
    if (e.convention == c) return std::string(e.name);
  }
  throw UsageError("unknown convention value");
}

Convention parse_convention(std::string_view s) {
  if (auto c = find_convention(s)) return *c;
  throw UsageError("unknown convention '" + std::string(s) + "'; known: " + names_of(kConventions));
}

Variant::Variant() : family(&find_family("softmax")) {}

Variant Variant::with_params(std::shared_ptr<const FamilyParams> p) const {
  Variant out = *this;
  if (p) out.params = std::move(p);
  return out;
}

std::string Variant::name() const {
  std::string out(family->name());
  if (uses_map()) out.append(":").append(map.name());
  const std::vector<std::string_view> parts = family->parts();
  if (!parts.empty()) out.append(":").append(parts.at(static_cast<std::size_t>(part)));
  return out.append("@").append(to_string(convention));
}

bool Variant::supports(std::string* why) const { return family->supports(*this, why); }

Variant parse_variant(std::string_view spec_in, Convention default_convention, std::uint64_t seed) {
  const std::string_view spec = trim(spec_in);
  if (spec.empty()) throw UsageError("empty variant spec; known families: " + known_families());
  const auto at = spec.find('@');
  const std::string_view body = spec.substr(0, at);
  std::optional<Convention> convention;
  if (at != std::string_view::npos) convention = parse_convention(spec.substr(at + 1));

  const auto colon = body.find(':');
  Variant v;
  v.family = &find_family(body.substr(0, colon));
  std::optional<std::string_view> map_spec;
  if (colon != std::string_view::npos) map_spec = body.substr(colon + 1);

  // Shorthand "mala:code", "inline:paper": the map slot holds a convention name.
  if (map_spec) {
    if (auto c = find_convention(*map_spec)) {
      if (convention && *convention != *c) bad_spec(spec, "two different conventions");
      convention = c;
      map_spec.reset();
    }
  }
  const std::string family(v.family->name());
  const std::vector<std::string_view> parts = v.family->parts();
  if (!parts.empty() && map_spec) {  // the map slot names one of the family's row maps
    std::string known;
    for (std::size_t p = 0; p < parts.size(); ++p) {
      if (parts[p] == *map_spec) v.part = static_cast<int>(p);
      known += (p ? ", " : "") + std::string(parts[p]);
    }
    if (parts[static_cast<std::size_t>(v.part)] != *map_spec)
      bad_spec(spec, family + " computes the maps " + known + "; '" + std::string(*map_spec) + "' is none of them");
    map_spec.reset();
  }
  const MapRule rule = v.family->map_rule();
  if (rule == MapRule::None && map_spec) bad_spec(spec, family + " takes no feature map");
  if (rule == MapRule::Required && !map_spec) {
    bad_spec(spec, family + " needs a feature map, e.g. " + family + ":relu; known maps: " +
                       known_feature_maps());
  }
  if (map_spec) {
    v.map = parse_feature_map(*map_spec, seed);
  } else if (rule == MapRule::Defaulted) {
    v.map = parse_feature_map(v.family->default_map(), seed);
  }
  v.convention = convention.value_or(default_convention);
  // A convention computed by another family (mala@code+rope is mala_rope@code): hand it over, map
  // and all (both families take the same maps).
  if (const auto moved = v.family->convention_family(v.convention)) {
    v.family = moved->first;
    v.convention = moved->second;
  }
  return v;
}

std::vector<Variant> parse_variants(std::string_view specs, Convention default_convention,
                                    std::uint64_t seed) {
  if (trim(specs).empty()) throw UsageError("empty variant list; known families: " + known_families());
  std::vector<Variant> out;
  std::vector<std::string_view> spelled;
  for (const std::string_view raw : split_list(specs)) {
    const std::string_view item = trim(raw);
    Variant v = parse_variant(item, default_convention, seed);
    // Two spellings of one variant (mala, mala:elu1@paper) would give every result twice.
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (out[i].name() == v.name()) {
        throw UsageError("variant '" + std::string(item) + "' repeats '" + std::string(spelled[i]) +
                         "' (both are " + v.name() + ")");
      }
    }
    out.push_back(std::move(v));
    spelled.push_back(item);
  }
  return out;
}

}  // namespace attnscope
