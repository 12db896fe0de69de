// Reference: MALA as its released code computes it (qhfan/MALA classfication_release/model.py,
// AddLinearAttention): q, k after ELU+1 (phi); z from the unrotated features, then q and k
// rotated by the stage's 2-D RoPE for the numerator only:
//   code:  z_i = s phi(q_i) . mean_m phi(k_m),
//          w_ij = (s/N) R phi(q_i) . R phi(k_j) (1 + 1/(z_i + 1e-6)) - z_i / N;
//   paper: S_i = phi(q_i) . sum_m phi(k_m),  w_ij = (1 + 1/S_i) R phi(q_i) . R phi(k_j) - S_i / N
//          (MALA eq. 8-9 with the rotated numerator; degenerate where S_i is zero or tiny).
// Without the rotation the rows sum to 1 (code: to z/(z + 1e-6)); with it they do not, and are
// never renormalised.
#include "../field_support.hpp"

namespace attnscope::reference {
namespace {

struct RowTerms {
  double a = 0.0;  // factor on R phi(q_i) . R phi(k_j)
  double b = 0.0;  // the constant of the row
  bool degenerate = false;
};

/// a_i, b_i of row i from the unrotated features.
RowTerms row_terms(Convention c, const MatD& fq, const MatD& fk, double scale, Eigen::Index i) {
  const double n = static_cast<double>(fk.rows());
  const double S = support::kept_score_sum(fq, fk, nullptr, i);
  RowTerms r;
  if (c == Convention::Paper) {
    r.degenerate = support::tiny(S, support::magnitude(fq, fk, nullptr, i));
    if (!r.degenerate) r = {1.0 + 1.0 / S, -S / n, false};
  } else {
    const double z = scale * S / n;
    r.degenerate = z + 1e-6 == 0.0;
    if (!r.degenerate) r = {scale / n * (1.0 + 1.0 / (z + 1e-6)), -z / n, false};
  }
  return r;
}

}  // namespace

MatD mala_rope_weights(Convention c, const MatD& q, const MatD& k, double scale,
                       const Rotation& rotation, std::vector<int>* degenerate) {
  using namespace support;
  const MatD fq = field::elu1(q), fk = field::elu1(k);
  const MatD rq = rotate(rotation, fq), rk = rotate(rotation, fk);
  MatD w = MatD::Zero(q.rows(), k.rows());
  for (Eigen::Index i = 0; i < q.rows(); ++i) {
    const RowTerms r = row_terms(c, fq, fk, scale, i);
    if (!std::isfinite(r.a) || !std::isfinite(r.b)) {
      poison(w, i);
      continue;
    }
    if (r.degenerate) {
      if (degenerate) degenerate->push_back(static_cast<int>(i));
      continue;
    }
    for (Eigen::Index j = 0; j < k.rows(); ++j) w(i, j) = r.a * dot(rq, i, rk, j) + r.b;
  }
  return w;
}

MatD mala_rope_outputs(Convention c, const MatD& q, const MatD& k, const MatD& v, double scale,
                       const Rotation& rotation) {
  const MatD fq = field::elu1(q), fk = field::elu1(k);
  const MatD rq = rotate(rotation, fq), rk = rotate(rotation, fk);
  const Eigen::Index n = k.rows(), d = k.cols();
  // sum_j R phi(k_j) v_j^T and sum_j v_j, formed before any query (the module's kv and mean v).
  MatD kv = MatD::Zero(d, v.cols());
  VecD v_sum = VecD::Zero(v.cols());
  for (Eigen::Index j = 0; j < n; ++j) {
    for (Eigen::Index e = 0; e < v.cols(); ++e) {
      v_sum(e) += v(j, e);
      for (Eigen::Index t = 0; t < d; ++t) kv(t, e) += rk(j, t) * v(j, e);
    }
  }
  MatD out = MatD::Zero(q.rows(), v.cols());
  for (Eigen::Index i = 0; i < q.rows(); ++i) {
    const RowTerms r = row_terms(c, fq, fk, scale, i);
    if (r.degenerate) continue;
    for (Eigen::Index e = 0; e < v.cols(); ++e) {
      double s = 0.0;
      for (Eigen::Index t = 0; t < d; ++t) s += rq(i, t) * kv(t, e);
      out(i, e) = r.a * s + r.b * v_sum(e);
    }
  }
  return out;
}

MatD weights_mala_rope(const Variant&, const MatD&, const MatD&, double, const Mask*,
                       std::vector<int>&) {
  field::needs_layer_data("mala_rope", "the stage's RoPE rotation", "mala_rope_weights");
}

}  // namespace attnscope::reference
