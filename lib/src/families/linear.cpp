// linear: phi(q_i).phi(k_j) / sum_m phi(q_i).phi(k_m) for a feature map phi (required in the
// spec). The code convention's factor on phi cancels. Degenerate where the denominator is zero or
// below kTinyDenominator |phi(q_i)| |sum phi(k)| (e.g. ReLU kills the whole query).
#include "attnscope/family.hpp"

namespace attnscope {
namespace {

class Linear final : public KernelFamily {
 public:
  std::string_view name() const override { return "linear"; }
  std::string_view formula() const override {
    return "phi(q_i).phi(k_j) / sum_m phi(q_i).phi(k_m)   (Katharopoulos et al. 2020; InLine eq. 2)";
  }
  MapRule map_rule() const override { return MapRule::Required; }
  std::vector<MagnitudeLaw> magnitude_laws() const override { return {MagnitudeLaw::LinearInvariant}; }
  RowForm row_form(double S, int n_kept, double magnitude) const override {
    return normalised_row(S, n_kept, magnitude);
  }
  bool has_offset() const override { return false; }
};

}  // namespace

const AttentionFamily& family_linear() {
  static const Linear family;
  return family;
}

}  // namespace attnscope
