// efficient (Efficient Attention, Shen et al. WACV 2021): W = rho_q(Q) rho_k(K)^T, rho_q a softmax
// over the d features of each query, rho_k a softmax over the N tokens of each key feature; no
// scale, the same in both conventions, no feature map. Rows sum to 1 by construction
// (S_i = rho_q(q_i).sum_m rho_k(k_m) = 1); the kernel form divides by S_i all the same, which
// makes the masked row (kept keys renormalised) the plain linear-attention rule. Rank d; outputs in
// linear time as rho_q(Q) (rho_k(K)^T V).
#include "attnscope/family.hpp"

#include "attnscope/portable_math.hpp"
#include "attnscope/variant.hpp"

namespace attnscope {
namespace {

/// Softmax of every row of x into out (max subtracted).
void softmax_each_row(ConstRef<double> x, Eigen::Ref<MatD> out) {
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    const double top = x.row(i).maxCoeff();
    out.row(i) = (x.row(i).array() - top).unaryExpr(portable::Exp{}).matrix();
    out.row(i) /= out.row(i).sum();
  }
}

class Efficient final : public KernelFamily {
 public:
  std::string_view name() const override { return "efficient"; }
  std::string_view formula() const override {
    return "rho_q(q_i).rho_k(k_j), rho_q softmax over features, rho_k softmax over tokens   "
           "(Shen et al. 2021, Efficient Attention)";
  }
  MapRule map_rule() const override { return MapRule::None; }
  std::vector<MagnitudeLaw> magnitude_laws() const override { return {MagnitudeLaw::LinearInvariant}; }
  int feature_dim(const Variant& /*v*/, int d) const override { return d; }
  void query_features(const Variant& /*v*/, ConstRef<double> q, TokenPositions /*positions*/,
                      Eigen::Index /*n_keys*/, double /*scale*/, Eigen::Ref<MatD> out) const override {
    softmax_each_row(q, out);
  }
  void key_features(const Variant& /*v*/, ConstRef<double> /*q*/, ConstRef<double> k,
                    double /*scale*/, Eigen::Ref<MatD> out) const override {
    for (Eigen::Index t = 0; t < k.cols(); ++t) {
      const double top = k.col(t).maxCoeff();
      out.col(t) = (k.col(t).array() - top).unaryExpr(portable::Exp{}).matrix();
      out.col(t) /= out.col(t).sum();
    }
  }
  RowForm row_form(double S, int n_kept, double magnitude) const override {
    return normalised_row(S, n_kept, magnitude);
  }
  bool has_offset() const override { return false; }
  bool query_features_homogeneous(const Variant& /*v*/) const override { return false; }
};

}  // namespace

const AttentionFamily& family_efficient() {
  static const Efficient family;
  return family;
}

}  // namespace attnscope
