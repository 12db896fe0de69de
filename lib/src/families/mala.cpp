// mala (MALA, Fan et al. ICCV 2025, eq. 8-9): beta_i phi(q_i).phi(k_j) - gamma_i with
// S = phi(q_i).sum_m phi(k_m), beta = 1 + 1/S, gamma = S/N; phi defaulting to ELU + 1. Code
// convention: phi scaled by (s/N)^1/2. Degenerate where S is zero or tiny (kTinyDenominator);
// weights can be negative. The released code's form (RoPE in the numerator only), which dumps
// name mala@code+rope, is the family mala_rope (mala_rope.cpp): convention_family hands it over.
#include "attnscope/family.hpp"

#include "attnscope/variant.hpp"

#include <cmath>

namespace attnscope {
namespace {

class Mala final : public KernelFamily {
 public:
  std::string_view name() const override { return "mala"; }
  std::string_view formula() const override {
    return "beta_i phi(q_i).phi(k_j) - gamma_i, beta = 1 + 1/S, gamma = S/N, S = phi(q_i).sum_m "
           "phi(k_m)   (Fan et al. 2025, MALA eq. 8-9)";
  }
  MapRule map_rule() const override { return MapRule::Defaulted; }
  std::string_view default_map() const override { return "elu1"; }
  bool weights_can_be_negative() const override { return true; }
  std::optional<std::pair<const AttentionFamily*, Convention>> convention_family(
      Convention c) const override {
    if (c != Convention::CodeRope) return std::nullopt;
    return std::pair<const AttentionFamily*, Convention>{&find_family("mala_rope"),
                                                         Convention::Code};
  }
  std::vector<MagnitudeLaw> magnitude_laws() const override {
    return {MagnitudeLaw::MalaRatio, MagnitudeLaw::MalaBetaGamma};
  }
  RowForm row_form(double S, int n_kept, double magnitude) const override {
    if (n_kept == 0 || !(std::abs(S) > kTinyDenominator * magnitude)) return {};
    return {1.0 + 1.0 / S, -S / static_cast<double>(n_kept), false};
  }
  bool has_offset() const override { return true; }
};

}  // namespace

const AttentionFamily& family_mala() {
  static const Mala family;
  return family;
}

}  // namespace attnscope
