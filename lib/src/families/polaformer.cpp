// polaformer (polarity-aware linear attention, Meng et al. ICLR 2025, PolaLinearAttention): each
// channel t of q and k divided by the learned scale a_t (feature_scale: softplus of the module's
// `scale`), split by sign and raised to the learned exponent p_t (exponent: 1 + alpha sigmoid of
// its `power`): x+ = ReLU(x/a)^p, x- = ReLU(-x/a)^p. Two row maps per head:
//   same_ij     = [q+, q-]_i.[k+, k-]_j / (sum_m [q+, q-]_i.[k+, k-]_m + N eps)
//   opposite_ij = [q-, q+]_i.[k+, k-]_j / (sum_m [q-, q+]_i.[k+, k-]_m + N eps)
// eps = 1e-6 in the code convention (z = 1 / (q.mean k + 1e-6)), 0 in the paper's (each map then
// row-stochastic; in the code's, rows sum to S/(S + N eps) < 1, never renormalised). The model's
// output is [same V_1, opposite V_2], V_1 the first ceil(dv/2) value channels (torch.chunk):
// the spec's map slot picks the map (polaformer:same, the default, or polaformer:opposite) and
// output_columns says which channels it weighs. A kernel family of width 2d: linear-time outputs,
// W = Z M. Powers as exp(p log u) with portable::exp and portable::log (the same bits on every
// CPU).
#include "attnscope/family.hpp"

#include "../field_features.hpp"

namespace attnscope {
namespace {

/// The released code's denominator eps per key (code convention).
double pola_eps(const Variant& v) { return v.convention == Convention::Paper ? 0.0 : 1e-6; }

/// [ReLU(x/a)^p, ReLU(-x/a)^p] of every row into out (x.rows() x 2d); `swap` puts the negative part
/// first.
void signed_powers(const Variant& v, ConstRef<double> x, bool swap, Eigen::Ref<MatD> out) {
  const Eigen::Index d = x.cols();
  const MatD& a = family_param(v, "feature_scale", 1, d);
  const MatD& p = family_param(v, "exponent", 1, d);
  for (Eigen::Index t = 0; t < d; ++t) {
    if (!(a(0, t) > 0.0) || !(p(0, t) > 0.0)) {
      throw UsageError(v.name() +
                       ": feature_scale and exponent must be > 0 (softplus and 1 + alpha sigmoid "
                       "are); channel " +
                       std::to_string(t) + " has " + std::to_string(a(0, t)) + ", " +
                       std::to_string(p(0, t)));
    }
  }
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    for (Eigen::Index t = 0; t < d; ++t) {
      const double u = x(i, t) / a(0, t);
      const double pos = u > 0.0 ? portable::exp(p(0, t) * portable::log(u)) : 0.0;
      const double neg = u < 0.0 ? portable::exp(p(0, t) * portable::log(-u)) : 0.0;
      out(i, swap ? d + t : t) = pos;
      out(i, swap ? t : d + t) = neg;
    }
  }
}

class PolaFormer final : public KernelFamily {
 public:
  std::string_view name() const override { return "polaformer"; }
  std::string_view formula() const override {
    return "[q+, q-]_i.[k+, k-]_j (same) or [q-, q+]_i.[k+, k-]_j (opposite) / its row sum [+ N "
           "1e-6 "
           "@code], x+- = ReLU(+-x/a)^p   (PolaFormer, Meng et al. 2025)";
  }
  MapRule map_rule() const override { return MapRule::None; }
  std::vector<std::string_view> parts() const override { return {"same", "opposite"}; }
  std::pair<int, int> output_columns(const Variant& v, int dv) const override {
    const int half = (dv + 1) / 2;  // torch.chunk(v, 2, -1)
    return v.part == 0 ? std::pair<int, int>{0, half} : std::pair<int, int>{half, dv - half};
  }
  std::vector<std::string_view> params(const Variant& /*v*/) const override {
    return {"feature_scale", "exponent"};
  }
  bool rows_sum_to_one(const Variant& v) const override {
    return v.convention == Convention::Paper;
  }
  std::vector<MagnitudeLaw> magnitude_laws() const override {
    return {MagnitudeLaw::LinearInvariant};
  }
  int feature_dim(const Variant& /*v*/, int d) const override { return 2 * d; }
  void query_features(const Variant& v, ConstRef<double> q, TokenPositions /*positions*/,
                      Eigen::Index /*n_keys*/, double /*scale*/,
                      Eigen::Ref<MatD> out) const override {
    signed_powers(v, q, v.part == 1, out);
  }
  void key_features(const Variant& v, ConstRef<double> /*q*/, ConstRef<double> k, double /*scale*/,
                    Eigen::Ref<MatD> out) const override {
    signed_powers(v, k, false, out);
  }
  RowForm row_form(double S, int n_kept, double magnitude) const override {
    return normalised_row(S, n_kept, magnitude);
  }
  RowForm variant_row_form(const Variant& v, double S, int n_kept,
                           double magnitude) const override {
    return detail::eps_normalised_row(S, n_kept, magnitude, pola_eps(v));
  }
  bool has_offset() const override { return false; }
  bool query_features_homogeneous(const Variant& /*v*/) const override { return false; }
};

}  // namespace

const AttentionFamily& family_polaformer() {
  static const PolaFormer family;
  return family;
}

}  // namespace attnscope
