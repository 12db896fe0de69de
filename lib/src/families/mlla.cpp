// mlla (the linear attention of MLLA, "Demystify Mamba in Vision", as LeapLabTHU/MLLA
// models/mlla.py computes it): phi = ELU + 1, no scale, the layer's 2-D RoPE in the numerator
// only:
//   w_ij = R phi(q_i).R phi(k_j) / (sum_m phi(q_i).phi(k_m) + N eps),
// eps = 1e-6 in the code convention (the module's z = 1 / (q.mean k + 1e-6)), 0 in the paper's.
// R turns channel pair (2p, 2p+1) of token t by the stored cosine and sine (rope_cos, rope_sin:
// the model's own float32 values, per head: MLLA's rotation spans the layer's channels, so heads
// differ). The kernel form with normaliser features of its own: f = R phi, g = phi, so outputs
// take linear time (R phi(Q) (R phi(K)^T V)) and W = Z M as for every kernel family. Rows do not
// sum to 1 (the rotation is in the numerator only) and are never renormalised; the rotated
// numerator can be negative. Under a mask S_i runs over the kept keys and eps over their count.
#include "attnscope/family.hpp"

#include "../field_features.hpp"

namespace attnscope {
namespace {

class Mlla final : public detail::RopeNumeratorFamily {
 public:
  std::string_view name() const override { return "mlla"; }
  std::string_view formula() const override {
    return "R phi(q_i).R phi(k_j) / (sum_m phi(q_i).phi(k_m) [+ N 1e-6 @code]), phi = ELU+1, R the "
           "layer's RoPE   (MLLA, Han et al. 2024, models/mlla.py)";
  }

 protected:
  void base_keys(const Variant& /*v*/, ConstRef<double> /*q*/, ConstRef<double> k, double /*scale*/,
                 Eigen::Ref<MatD> out) const override {
    detail::elu1_into(k, 1.0, out);
  }
};

}  // namespace

const AttentionFamily& family_mlla() {
  static const Mlla family;
  return family;
}

}  // namespace attnscope
