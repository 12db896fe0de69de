// The variants every comparison test walks through: each family of the registry (family.hpp) x
// feature map (where the family takes one) x convention. A family added to the registry is in
// every generic test without a line here.
#pragma once

#include "attnscope/variant.hpp"

#include <string>
#include <vector>

namespace attnscope::test {

inline const std::vector<std::string>& feature_map_specs() {
  static const std::vector<std::string> maps{"identity", "relu",          "leaky_relu=0.2", "elu1",
                                             "exp",      "relu_affine=7", "focused=3"};
  return maps;
}

/// The families computed from q and k alone (every family but those that need per-layer model
/// data, AttentionFamily::params: the field's families, which test_field_registry.cpp walks with
/// their data bound).
inline std::vector<const AttentionFamily*> qk_families() {
  std::vector<const AttentionFamily*> out;
  for (const AttentionFamily* family : all_families()) {
    if (!parse_variant(example_spec(*family)).needs_params()) out.push_back(family);
  }
  return out;
}

inline std::vector<std::string> all_variant_specs() {
  std::vector<std::string> specs;
  for (const AttentionFamily* family : qk_families()) {
    const std::string name(family->name());
    if (family->map_rule() == MapRule::None) {
      for (const char* convention : {"paper", "code"}) specs.push_back(name + "@" + convention);
      continue;
    }
    for (const auto& map : feature_map_specs()) {
      for (const char* convention : {"paper", "code"}) {
        specs.push_back(name + ":" + map + "@" + convention);
      }
    }
  }
  return specs;
}

/// The specs of the families with a kernel form (linear-time outputs, low-rank form).
inline std::vector<std::string> linear_family_specs() {
  std::vector<std::string> out;
  for (const auto& s : all_variant_specs()) {
    if (parse_variant(s).linear_time_outputs()) out.push_back(s);
  }
  return out;
}

/// Whether rows of the variant divide by a denominator that can vanish (its row form has a
/// degenerate rule beyond an empty mask).
inline bool divides(const Variant& v) {
  const KernelFamily* kernel = v.kernel();
  return kernel != nullptr && kernel->row_form(0.0, 1, 1.0).degenerate;
}

/// Mean of the random Q and K entries for a variant. Linear and MALA divide by
/// phi(q).sum phi(k) (divides()); with a sign-changing map (identity, leaky_relu) and zero-mean inputs that
/// denominator comes arbitrarily close to 0 for some rows, where any two correct implementations
/// disagree by far more than rounding. A positive mean keeps it away from 0; the degenerate and
/// tiny-denominator cases have their own tests.
inline double input_mean(const Variant& v) {
  const bool sign_changing =
      v.uses_map() && (v.map.kind == MapKind::Identity || v.map.kind == MapKind::LeakyRelu);
  return divides(v) && sign_changing ? 1.0 : 0.0;
}

/// Test-name-safe form of a spec for parameterised tests.
inline std::string param_name(std::string s) {
  for (char& c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) c = '_';
  }
  return s;
}

}  // namespace attnscope::test
