// relu (ReLU linear attention as EfficientViT, Cai et al. ICCV 2023, and SANA, Xie et al. ICLR
// 2025, compute it): features ReLU(x), no scale (it would cancel), no feature map in the spec.
//   paper: ReLU(q_i).ReLU(k_j) / sum_m ReLU(q_i).ReLU(k_m)   (EfficientViT eq. 2), the weights of
//          linear:relu, with its degenerate rule (S zero or below kTinyDenominator times
//          |f_q| |sum f_k|).
//   code:  ReLU(q_i).ReLU(k_j) / (sum_m ReLU(q_i).ReLU(k_m) + 1e-15), the released LiteMLA's
//          denominator eps: rows sum to S_i / (S_i + 1e-15), not 1, and a row with a tiny S_i is a
//          small row, not a degenerate one. Only S_i = 0 (ReLU kills the query, or no key shares a
//          live feature with it) is degenerate; its weights are 0, as the code's 0 / eps gives.
// Arithmetic of the released code: EfficientViT's LiteMLA turns autocast off and divides in
// float32; SANA's LiteLA forms the products in float32 where its fp32_attention flag is set and in
// the model's half type otherwise, dividing in float32 either way (SANA can also rotate q and k
// before the ReLU, inside both sums: not this family). The library computes the formula in
// double like every family, so its rows are the exact rows of that formula.
#include "attnscope/family.hpp"

#include "attnscope/variant.hpp"

namespace attnscope {
namespace {

/// The released code's denominator eps (LiteMLA's `eps`, SANA's LiteLA alike).
constexpr double kCodeEps = 1e-15;

class ReluLinear final : public KernelFamily {
 public:
  std::string_view name() const override { return "relu"; }
  std::string_view formula() const override {
    return "ReLU(q_i).ReLU(k_j) / (sum_m ReLU(q_i).ReLU(k_m) [+ 1e-15 @code])   (Cai et al. 2023, "
           "EfficientViT eq. 2; SANA)";
  }
  MapRule map_rule() const override { return MapRule::None; }
  bool rows_sum_to_one(const Variant& v) const override {
    return v.convention == Convention::Paper;
  }
  std::vector<MagnitudeLaw> magnitude_laws() const override {
    return {MagnitudeLaw::LinearInvariant};
  }
  int feature_dim(const Variant& /*v*/, int d) const override { return d; }
  void query_features(const Variant& /*v*/, ConstRef<double> q, TokenPositions /*positions*/,
                      Eigen::Index /*n_keys*/, double /*scale*/,
                      Eigen::Ref<MatD> out) const override {
    out = q.cwiseMax(0.0);
  }
  void key_features(const Variant& /*v*/, ConstRef<double> /*q*/, ConstRef<double> k,
                    double /*scale*/, Eigen::Ref<MatD> out) const override {
    out = k.cwiseMax(0.0);
  }
  RowForm row_form(double S, int n_kept, double magnitude) const override {
    return normalised_row(S, n_kept, magnitude);
  }
  RowForm variant_row_form(const Variant& v, double S, int n_kept,
                           double magnitude) const override {
    if (v.convention == Convention::Paper) return row_form(S, n_kept, magnitude);
    if (n_kept == 0 || S == 0.0) return {};  // S >= 0: ReLU features
    return {1.0 / (S + kCodeEps), 0.0, false};
  }
  bool has_offset() const override { return false; }
  bool query_features_homogeneous(const Variant& /*v*/) const override { return true; }
};

}  // namespace

const AttentionFamily& family_relu() {
  static const ReluLinear family;
  return family;
}

}  // namespace attnscope
