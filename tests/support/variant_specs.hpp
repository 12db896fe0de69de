// The variants every comparison test walks through: each family x feature map x convention.
#pragma once

#include "attnscope/variant.hpp"

#include <string>
#include <vector>

namespace attnscope::test {

inline const std::vector<std::string>& feature_map_specs() {
  static const std::vector<std::string> maps{"identity", "relu", "leaky_relu=0.2",
                                             "elu1",     "exp",  "relu_affine=7"};
  return maps;
}

inline std::vector<std::string> all_variant_specs() {
  std::vector<std::string> specs{"softmax@paper", "softmax@code"};
  for (const char* family : {"linear", "inline", "mala"}) {
    for (const auto& map : feature_map_specs()) {
      for (const char* convention : {"paper", "code"}) {
        specs.push_back(std::string(family) + ":" + map + "@" + convention);
      }
    }
  }
  return specs;
}

inline std::vector<std::string> linear_family_specs() {
  std::vector<std::string> out;
  for (const auto& s : all_variant_specs()) {
    if (s.rfind("softmax", 0) != 0) out.push_back(s);
  }
  return out;
}

/// Mean of the random Q and K entries for a variant. Linear and MALA divide by
/// phi(q).sum phi(k); with a sign-changing map (identity, leaky_relu) and zero-mean inputs that
/// denominator comes arbitrarily close to 0 for some rows, where any two correct implementations
/// disagree by far more than rounding. A positive mean keeps it away from 0; the degenerate and
/// tiny-denominator cases have their own tests.
inline double input_mean(const Variant& v) {
  const bool divides = v.family == Family::Linear || v.family == Family::Mala;
  const bool sign_changing = v.map.kind == MapKind::Identity || v.map.kind == MapKind::LeakyRelu;
  return divides && sign_changing ? 1.0 : 0.0;
}

/// Test-name-safe form of a spec for parameterised tests.
inline std::string param_name(std::string s) {
  for (char& c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) c = '_';
  }
  return s;
}

}  // namespace attnscope::test
