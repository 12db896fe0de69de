// Attention families by name: one registry, one table (variant.cpp), no chains of special cases.
//
// Spec grammar:   family[:map][@convention]
//   family      a name of the family registry (family.hpp; `attnscope info --families` lists them)
//   map         a feature_map spec (feature_map.hpp), for families whose MapRule allows one:
//               softmax, efficient and cosformer take none, linear requires one, inline defaults
//               to identity, mala to elu1; for a family with several row maps (parts(): PolaFormer's
//               same, opposite) the name of one, default the first
//   convention  paper (the papers' equations) | code (the released code's scaling) |
//               code+rope (MALA as its released code computes it: RoPE in the numerator only)
// "mala:code" and "inline:paper" are accepted as shorthand: a map slot holding a convention name.
// Without @convention the default passed to parse_variant applies (a dump's own, or paper).
// Each family's weights, in both conventions, are documented in its own file under
// lib/src/families/ and in docs/attention.md.
#pragma once

#include "attnscope/family.hpp"
#include "attnscope/feature_map.hpp"

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace attnscope {

enum class Convention { Paper, Code, CodeRope };

struct Variant {
  Variant();  ///< softmax@paper
  const AttentionFamily* family;  ///< never null: an entry of the registry
  FeatureMap map;  ///< used only by families whose MapRule is not None
  Convention convention = Convention::Paper;
  /// Which of the family's row maps (AttentionFamily::parts(); 0 for families with one).
  int part = 0;
  /// One head's model data for families that need it (AttentionFamily::params()); null until
  /// bound (the dump loop binds each head's). Not part of the name: a variant names a formula.
  std::shared_ptr<const FamilyParams> params;

  /// Canonical spec, e.g. "softmax@paper", "linear:relu@paper", "mala:elu1@code".
  [[nodiscard]] std::string name() const;
  /// Whether this build can compute the variant; when not, `why` says why.
  [[nodiscard]] bool supports(std::string* why = nullptr) const;
  /// The family's kernel form (outputs in O(N d^2), low-rank form), or null (a score family).
  [[nodiscard]] const KernelFamily* kernel() const { return family->kernel(); }
  /// The family's score form (rows from scaled logits), or null (a kernel family).
  [[nodiscard]] const ScoreFamily* score() const { return family->score(); }
  /// Which form the family's weights take (AttentionFamily::form()).
  [[nodiscard]] Form form() const { return family->form(); }
  /// True where the outputs can be computed in O(N d^2): the kernel form's.
  [[nodiscard]] bool linear_time_outputs() const { return form() == Form::Kernel; }
  /// True where rows are guaranteed to sum to 1 (false for code+rope).
  [[nodiscard]] bool rows_sum_to_one() const { return family->rows_sum_to_one(*this); }
  /// Whether the spec carries a feature map (the family's MapRule is not None).
  [[nodiscard]] bool uses_map() const { return family->map_rule() != MapRule::None; }
  /// Whether the family needs per-layer model data (AttentionFamily::params()).
  [[nodiscard]] bool needs_params() const { return !family->params(*this).empty(); }
  /// This variant with `p` bound (the same variant when p is null).
  [[nodiscard]] Variant with_params(std::shared_ptr<const FamilyParams> p) const;
};

[[nodiscard]] Variant parse_variant(std::string_view spec, Convention default_convention = Convention::Paper,
                                    std::uint64_t seed = 0);
/// Comma-separated list of specs. Throws UsageError on an empty list or item, and on a variant
/// named twice (compared by canonical name, so "mala" repeats "mala:elu1@paper").
[[nodiscard]] std::vector<Variant> parse_variants(std::string_view specs,
                                                  Convention default_convention = Convention::Paper,
                                                  std::uint64_t seed = 0);
[[nodiscard]] std::string to_string(Convention c);
[[nodiscard]] Convention parse_convention(std::string_view s);
/// The convention of that name, or nullopt.
[[nodiscard]] std::optional<Convention> find_convention(std::string_view s);
/// "paper, code or code+rope", for messages.
[[nodiscard]] std::string convention_names();

}  // namespace attnscope
