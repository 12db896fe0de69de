// cosformer (cosFormer, Qin et al. ICLR 2022, bidirectional): the weight of key j for query i is
// proportional to ReLU(q_i).ReLU(k_j) cos(pi/2 (i - j)/N), i, j token indices 0..N-1, normalised
// over j; no scale (it would cancel), the same in both conventions, no feature map. Through
// cos(a - b) = cos a cos b + sin a sin b the kernel has features
//   f(x_i) = [ReLU(x_i) cos(pi i / 2N), ReLU(x_i) sin(pi i / 2N)]      (width 2d)
// for queries and keys alike, so the row is linear attention on them: rank 2d, outputs in linear
// time, degenerate like linear attention. The first family whose weights depend on token position:
// query rows carry their token index (TokenPositions).
#include "attnscope/family.hpp"

#include <cmath>
#include <numbers>

namespace attnscope {
namespace {

/// f of the rows of x, row r being token positions.at(r), for N tokens.
void positional_features(ConstRef<double> x, TokenPositions positions, Eigen::Index n_tokens,
                         Eigen::Ref<MatD> out) {
  const Eigen::Index d = x.cols();
  const double step = std::numbers::pi / (2.0 * static_cast<double>(n_tokens));
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    const double angle = step * static_cast<double>(positions.at(r));
    const auto relu = x.row(r).cwiseMax(0.0);
    out.row(r).head(d) = std::cos(angle) * relu;
    out.row(r).tail(d) = std::sin(angle) * relu;
  }
}

class CosFormer final : public KernelFamily {
 public:
  std::string_view name() const override { return "cosformer"; }
  std::string_view formula() const override {
    return "ReLU(q_i).ReLU(k_j) cos(pi/2 (i - j)/N) / sum_m ReLU(q_i).ReLU(k_m) cos(pi/2 (i - m)/N)"
           "   (Qin et al. 2022, cosFormer)";
  }
  MapRule map_rule() const override { return MapRule::None; }
  bool position_dependent() const override { return true; }
  std::vector<MagnitudeLaw> magnitude_laws() const override { return {MagnitudeLaw::LinearInvariant}; }
  int feature_dim(const Variant& /*v*/, int d) const override { return 2 * d; }
  void query_features(const Variant& /*v*/, ConstRef<double> q, TokenPositions positions,
                      Eigen::Index n_keys, double /*scale*/, Eigen::Ref<MatD> out) const override {
    positional_features(q, positions, n_keys, out);
  }
  void key_features(const Variant& /*v*/, ConstRef<double> /*q*/, ConstRef<double> k,
                    double /*scale*/, Eigen::Ref<MatD> out) const override {
    positional_features(k, TokenPositions{}, k.rows(), out);
  }
  RowForm row_form(double S, int n_kept, double magnitude) const override {
    return normalised_row(S, n_kept, magnitude);
  }
  bool has_offset() const override { return false; }
  bool query_features_homogeneous(const Variant& /*v*/) const override { return true; }
};

}  // namespace

const AttentionFamily& family_cosformer() {
  static const CosFormer family;
  return family;
}

}  // namespace attnscope
