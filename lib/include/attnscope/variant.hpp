// Attention families by name: one registry, one table (variant.cpp), no chains of special cases.
//
// Spec grammar:   family[:map][@convention]
//   family      softmax | linear | inline | mala
//   map         a feature_map spec (feature_map.hpp); softmax takes none, linear requires one,
//               inline defaults to identity, mala defaults to elu1
//   convention  paper (the papers' equations) | code (the released code's scaling) |
//               code+rope (reserved for MALA's post-z RoPE: parses, supports() says no)
// "mala:code" and "inline:paper" are accepted as shorthand: a map slot holding a convention name.
// Without @convention the default passed to parse_variant applies (a dump's own, or paper).
//
// Conventions (s = scale, normally head_dim^-1/2; N = number of tokens):
//   softmax  both:  exp(s q.k_j) / sum_m exp(s q.k_m)
//   linear   both:  phi(q).phi(k_j) / sum_m phi(q).phi(k_m)          (a scale on phi cancels)
//   inline   paper: phi(q).phi(k_j) - (1/N) sum_m phi(q).phi(k_m) + 1/N           (eq. 4)
//            code:  the paper form with phi replaced by (s/N)^1/2 phi
//   mala     paper: beta phi(q).phi(k_j) - gamma, beta = 1 + 1/(phi(q).sum_m phi(k_m)),
//                   gamma = phi(q).sum_m phi(k_m) / N                            (eq. 8-9)
//            code:  the paper form with phi replaced by (s/N)^1/2 phi
#pragma once

#include "attnscope/feature_map.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace attnscope {

enum class Family { Softmax, Linear, InLine, Mala };
enum class Convention { Paper, Code, CodeRope };

struct Variant {
  Family family = Family::Softmax;
  FeatureMap map;  ///< ignored for softmax
  Convention convention = Convention::Paper;

  /// Canonical spec, e.g. "softmax@paper", "linear:relu@paper", "mala:elu1@code".
  [[nodiscard]] std::string name() const;
  /// Whether this build can compute the variant; when not, `why` says why.
  [[nodiscard]] bool supports(std::string* why = nullptr) const;
  /// True where the outputs can be computed in O(N d^2) (linear, inline, mala).
  [[nodiscard]] bool has_linear_form() const { return family != Family::Softmax; }
  /// True where rows are guaranteed to sum to 1 (all four families; false for code+rope).
  [[nodiscard]] bool rows_sum_to_one() const { return convention != Convention::CodeRope; }
  /// The multiplier c applied to phi: 1 for paper, sqrt(scale / n_tokens) for code.
  [[nodiscard]] double phi_factor(double scale, int n_tokens) const;
};

[[nodiscard]] Variant parse_variant(std::string_view spec, Convention default_convention = Convention::Paper,
                                    std::uint64_t seed = 0);
/// Comma-separated list of specs. Throws UsageError on an empty list or item, and on a variant
/// named twice (compared by canonical name, so "mala" repeats "mala:elu1@paper").
[[nodiscard]] std::vector<Variant> parse_variants(std::string_view specs,
                                                  Convention default_convention = Convention::Paper,
                                                  std::uint64_t seed = 0);
[[nodiscard]] std::string to_string(Family f);
[[nodiscard]] std::string to_string(Convention c);
[[nodiscard]] Convention parse_convention(std::string_view s);
[[nodiscard]] Family parse_family(std::string_view s);

}  // namespace attnscope
