// Reference: PolaFormer's polarity-aware linear attention (Meng et al., ICLR 2025;
// PolaLinearAttention). Each channel t of q and k divided by the learned scale a_t (softplus of
// the module's `scale`), then split by sign and raised to the learned exponent p_t
// (1 + alpha sigmoid of the module's `power`): x+ = ReLU(x)^p, x- = ReLU(-x)^p. Same-sign and
// opposite-sign query features f_same = [q+, q-], f_opp = [q-, q+] meet the keys' [k+, k-]:
//   same_ij = f_same(q_i) . f(k_j) / (sum_m f_same(q_i) . f(k_m) + N eps), opposite likewise;
// eps = 1e-6 (code: z = 1 / (q . mean k + 1e-6)) or 0 (paper, each map exactly row-stochastic).
// The first half of the value channels goes through `same`, the second through `opposite`.
#include "../field_support.hpp"

namespace attnscope::reference {
namespace {

struct PolaFeatures {
  MatD same;      // [x+, x-] of the queries
  MatD opposite;  // [x-, x+] of the queries
  MatD keys;      // [x+, x-] of the keys
};

/// [ReLU(x/a)^p, ReLU(-x/a)^p] row by row; `swap` puts the negative part first.
MatD signed_powers(const MatD& x, const VecD& scale, const VecD& exponent, bool swap) {
  const Eigen::Index d = x.cols();
  MatD y(x.rows(), 2 * d);
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    for (Eigen::Index t = 0; t < d; ++t) {
      const double u = x(i, t) / scale(t);
      const double pos = u > 0.0 ? std::pow(u, exponent(t)) : 0.0;
      const double neg = u < 0.0 ? std::pow(-u, exponent(t)) : 0.0;
      y(i, swap ? d + t : t) = pos;
      y(i, swap ? t : d + t) = neg;
    }
  }
  return y;
}

PolaFeatures features(const MatD& q, const MatD& k, const VecD& scale, const VecD& exponent) {
  const Eigen::Index d = q.cols();
  if (k.cols() != d || scale.size() != d || exponent.size() != d) {
    throw UsageError("polaformer: q, k, feature_scale and exponent must have head_dim " +
                     std::to_string(d) + " entries per token; got k " + std::to_string(k.cols()) +
                     ", feature_scale " + std::to_string(scale.size()) + ", exponent " +
                     std::to_string(exponent.size()));
  }
  for (Eigen::Index t = 0; t < d; ++t) {
    if (!(scale(t) > 0.0) || !(exponent(t) > 0.0)) {
      throw UsageError(
          "polaformer: feature_scale and exponent must be > 0 (softplus and "
          "1 + alpha sigmoid are); channel " +
          std::to_string(t) + " has " + std::to_string(scale(t)) + ", " +
          std::to_string(exponent(t)));
    }
  }
  return {signed_powers(q, scale, exponent, false), signed_powers(q, scale, exponent, true),
          signed_powers(k, scale, exponent, false)};
}

MatD normalised_map(Convention c, const MatD& fq, const MatD& fk, std::vector<int>* degenerate) {
  using namespace support;
  const double n = static_cast<double>(fk.rows());
  MatD w = MatD::Zero(fq.rows(), fk.rows());
  for (Eigen::Index i = 0; i < fq.rows(); ++i) {
    const double S = kept_score_sum(fq, fk, nullptr, i);
    const double denominator = S + n * field::eps(c);
    if (!std::isfinite(denominator)) {
      poison(w, i);
      continue;
    }
    const bool zero =
        c == Convention::Paper ? tiny(S, magnitude(fq, fk, nullptr, i)) : denominator == 0.0;
    if (zero) {
      if (degenerate) degenerate->push_back(static_cast<int>(i));
      continue;
    }
    for (Eigen::Index j = 0; j < fk.rows(); ++j) w(i, j) = dot(fq, i, fk, j) / denominator;
  }
  return w;
}

/// The released module's route for one map: fq_i . (sum_j fk_j v_j / N) / (fq_i . mean fk + eps).
MatD linear_time(Convention c, const MatD& fq, const MatD& fk, const MatD& v) {
  const Eigen::Index n = fk.rows(), r = fk.cols();
  MatD kv = MatD::Zero(r, v.cols());
  VecD mean_k = VecD::Zero(r);
  for (Eigen::Index j = 0; j < n; ++j) {
    for (Eigen::Index t = 0; t < r; ++t) {
      mean_k(t) += fk(j, t) / static_cast<double>(n);
      for (Eigen::Index e = 0; e < v.cols(); ++e)
        kv(t, e) += fk(j, t) * v(j, e) / static_cast<double>(n);
    }
  }
  MatD out = MatD::Zero(fq.rows(), v.cols());
  for (Eigen::Index i = 0; i < fq.rows(); ++i) {
    double qk = 0.0, q2 = 0.0, m2 = 0.0;
    for (Eigen::Index t = 0; t < r; ++t) {
      qk += fq(i, t) * mean_k(t);
      q2 += fq(i, t) * fq(i, t);
      m2 += mean_k(t) * mean_k(t);
    }
    const double denominator = qk + field::eps(c);
    if (c == Convention::Paper ? support::tiny(qk, std::sqrt(q2) * std::sqrt(m2))
                               : denominator == 0.0)
      continue;
    for (Eigen::Index e = 0; e < v.cols(); ++e) {
      double s = 0.0;
      for (Eigen::Index t = 0; t < r; ++t) s += fq(i, t) * kv(t, e);
      out(i, e) = s / denominator;
    }
  }
  return out;
}

/// torch.chunk(v, 2, -1): the first ceil(dv/2) channels, then the rest.
Eigen::Index first_half(Eigen::Index dv) { return (dv + 1) / 2; }

}  // namespace

PolaMaps polaformer_weights(Convention c, const MatD& q, const MatD& k, const VecD& feature_scale,
                            const VecD& exponent, std::vector<int>* degenerate_same,
                            std::vector<int>* degenerate_opposite) {
  const PolaFeatures f = features(q, k, feature_scale, exponent);
  return {normalised_map(c, f.same, f.keys, degenerate_same),
          normalised_map(c, f.opposite, f.keys, degenerate_opposite)};
}

MatD polaformer_apply(const PolaMaps& maps, const MatD& v) {
  const Eigen::Index h = first_half(v.cols());
  MatD out(maps.same.rows(), v.cols());
  out.leftCols(h) = field::product(maps.same, v.leftCols(h));
  out.rightCols(v.cols() - h) = field::product(maps.opposite, v.rightCols(v.cols() - h));
  return out;
}

MatD polaformer_outputs(Convention c, const MatD& q, const MatD& k, const MatD& v,
                        const VecD& feature_scale, const VecD& exponent) {
  const PolaFeatures f = features(q, k, feature_scale, exponent);
  const Eigen::Index h = first_half(v.cols());
  MatD out(q.rows(), v.cols());
  out.leftCols(h) = linear_time(c, f.same, f.keys, v.leftCols(h));
  out.rightCols(v.cols() - h) = linear_time(c, f.opposite, f.keys, v.rightCols(v.cols() - h));
  return out;
}

MatD weights_polaformer(const Variant&, const MatD&, const MatD&, double, const Mask*,
                        std::vector<int>&) {
  field::needs_layer_data("polaformer", "the layer's feature scale and exponent",
                          "polaformer_weights");
}

}  // namespace attnscope::reference
