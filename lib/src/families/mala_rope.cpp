// mala_rope: MALA as its released code computes it (qhfan/MALA classfication_release/model.py,
// AddLinearAttention): phi (ELU + 1 by default) of q and k; the row form from the unrotated
// features, q and k turned by the stage's 2-D RoPE (rope_cos, rope_sin: the model's own float32
// values, the same for every head) for the numerator only.
//   code:  z_i = s phi(q_i).mean_m phi(k_m),
//          w_ij = (s/N) R phi(q_i).R phi(k_j) (1 + 1/(z_i + 1e-6)) - z_i/N;
//   paper: S_i = phi(q_i).sum_m phi(k_m),  w_ij = (1 + 1/S_i) R phi(q_i).R phi(k_j) - S_i/N
//          (MALA eq. 8-9 with the released code's rotated numerator).
// The kernel form with normaliser features of its own: f = c R phi, g = c phi (c = 1 paper,
// (s/N)^1/2 code), so S_i = g_q(i).sum g_k (= z_i in the code convention); degenerate where S_i is
// zero or tiny (paper) or z_i + 1e-6 is 0 (code). Rows do not sum to 1 (on random inputs far from
// it; MALA's issue #5) and are never renormalised. A dump names it `mala@code+rope` (mala's
// released convention, which the mala family hands to this one: convention_family).
#include "attnscope/family.hpp"

#include "../field_features.hpp"

#include <cmath>

namespace attnscope {
namespace {

/// The released code's eps in 1 / (z + 1e-6).
constexpr double kCodeEps = 1e-6;

class MalaRope final : public KernelFamily {
 public:
  std::string_view name() const override { return "mala_rope"; }
  std::string_view formula() const override {
    return "beta_i R phi(q_i).R phi(k_j) - S_i/N, beta = 1 + 1/S [1 + 1/(S + 1e-6) @code], S from "
           "the "
           "unrotated phi, R the stage's RoPE   (MALA as released, AddLinearAttention)";
  }
  MapRule map_rule() const override { return MapRule::Defaulted; }
  std::string_view default_map() const override { return "elu1"; }
  std::vector<std::string_view> params(const Variant& /*v*/) const override {
    return {"rope_cos", "rope_sin"};
  }
  bool rows_sum_to_one(const Variant& /*v*/) const override { return false; }
  bool position_dependent() const override { return true; }
  bool weights_can_be_negative() const override { return true; }
  std::vector<MagnitudeLaw> magnitude_laws() const override {
    return {MagnitudeLaw::MalaRatio, MagnitudeLaw::MalaBetaGamma};
  }
  void query_features(const Variant& v, ConstRef<double> q, TokenPositions positions,
                      Eigen::Index n_keys, double scale, Eigen::Ref<MatD> out) const override {
    KernelFamily::query_features(v, q, positions, n_keys, scale, out);
    detail::rotate_rows(detail::rope_tables(v, n_keys, out.cols()), positions, out);
  }
  void key_features(const Variant& v, ConstRef<double> q, ConstRef<double> k, double scale,
                    Eigen::Ref<MatD> out) const override {
    KernelFamily::key_features(v, q, k, scale, out);
    detail::rotate_rows(detail::rope_tables(v, k.rows(), out.cols()), TokenPositions{}, out);
  }
  bool separate_normaliser(const Variant& /*v*/) const override { return true; }
  void normaliser_query_features(const Variant& v, ConstRef<double> q, TokenPositions positions,
                                 Eigen::Index n_keys, double scale,
                                 Eigen::Ref<MatD> out) const override {
    KernelFamily::query_features(v, q, positions, n_keys, scale, out);
  }
  void normaliser_key_features(const Variant& v, ConstRef<double> q, ConstRef<double> k,
                               double scale, Eigen::Ref<MatD> out) const override {
    KernelFamily::key_features(v, q, k, scale, out);
  }
  RowForm row_form(double S, int n_kept, double magnitude) const override {
    if (n_kept == 0 || !(std::abs(S) > kTinyDenominator * magnitude)) return {};
    return {1.0 + 1.0 / S, -S / static_cast<double>(n_kept), false};
  }
  RowForm variant_row_form(const Variant& v, double S, int n_kept,
                           double magnitude) const override {
    if (v.convention == Convention::Paper) return row_form(S, n_kept, magnitude);
    if (n_kept == 0 || S + kCodeEps == 0.0) return {};
    return {1.0 + 1.0 / (S + kCodeEps), -S / static_cast<double>(n_kept), false};
  }
  bool has_offset() const override { return true; }
};

}  // namespace

const AttentionFamily& family_mala_rope() {
  static const MalaRope family;
  return family;
}

}  // namespace attnscope
