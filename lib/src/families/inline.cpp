// inline (InLine, Han et al. NeurIPS 2024, eq. 4): phi(q_i).phi(k_j) - (1/N) sum_m phi(q_i).phi(k_m)
// + 1/N, phi defaulting to the identity. Code convention: phi scaled by (s/N)^1/2. Row form
// a = 1, b = (1 - S)/n: never degenerate (no denominator) unless the mask keeps no key; weights
// can be negative.
#include "attnscope/family.hpp"

namespace attnscope {
namespace {

class InLine final : public KernelFamily {
 public:
  std::string_view name() const override { return "inline"; }
  std::string_view formula() const override {
    return "phi(q_i).phi(k_j) - (1/N) sum_m phi(q_i).phi(k_m) + 1/N   (Han et al. 2024, InLine eq. 4)";
  }
  MapRule map_rule() const override { return MapRule::Defaulted; }
  std::string_view default_map() const override { return "identity"; }
  bool weights_can_be_negative() const override { return true; }
  std::vector<MagnitudeLaw> magnitude_laws() const override { return {MagnitudeLaw::InlineAffine}; }
  RowForm row_form(double S, int n_kept, double /*magnitude*/) const override {
    if (n_kept == 0) return {};
    return {1.0, (1.0 - S) / static_cast<double>(n_kept), false};
  }
  bool has_offset() const override { return true; }
};

}  // namespace

const AttentionFamily& family_inline() {
  static const InLine family;
  return family;
}

}  // namespace attnscope
