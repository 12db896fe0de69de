// Library-internal pieces of the families of the field (lib/src/families/mlla.cpp, rala.cpp,
// mala.cpp's code+rope, polaformer.cpp, agent.cpp): ELU + 1 and the rotation of features by a
// head's stored RoPE cosines and sines. Nothing here knows a family's formula.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "attnscope/error.hpp"
#include "attnscope/family.hpp"
#include "attnscope/portable_math.hpp"
#include "attnscope/variant.hpp"

namespace attnscope::detail {

/// ELU(x) + 1 entry by entry, times `factor`: x + 1 above 0, exp(x) otherwise (portable::exp).
inline void elu1_into(ConstRef<double> x, double factor, Eigen::Ref<MatD> out) {
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    for (Eigen::Index t = 0; t < x.cols(); ++t) {
      const double e = x(i, t);
      out(i, t) = factor * (e > 0.0 ? e + 1.0 : portable::exp(e));
    }
  }
}

/// The head's RoPE (rope_cos, rope_sin: tokens x d/2) bound to v, checked against `tokens` and
/// the head dim d (which must be even).
struct RopeTables {
  const MatD& cos;
  const MatD& sin;
};
inline RopeTables rope_tables(const Variant& v, Eigen::Index tokens, Eigen::Index d) {
  if (d % 2 != 0) {
    throw UsageError(v.name() + ": RoPE turns channel pairs; the head dim " + std::to_string(d) +
                     " is odd");
  }
  return {family_param(v, "rope_cos", tokens, d / 2), family_param(v, "rope_sin", tokens, d / 2)};
}

/// Row r of x (token positions.at(r)) turned pair by pair: (x0 c - x1 s, x0 s + x1 c).
inline void rotate_rows(const RopeTables& rope, TokenPositions positions, Eigen::Ref<MatD> x) {
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    const Eigen::Index token = positions.at(r);
    if (token < 0 || token >= rope.cos.rows()) {
      throw UsageError("RoPE: token " + std::to_string(token) +
                       " has no rotation (the tables hold " + std::to_string(rope.cos.rows()) +
                       " tokens)");
    }
    for (Eigen::Index p = 0; p < rope.cos.cols(); ++p) {
      const double c = rope.cos(token, p), s = rope.sin(token, p);
      const double x0 = x(r, 2 * p), x1 = x(r, 2 * p + 1);
      x(r, 2 * p) = x0 * c - x1 * s;
      x(r, 2 * p + 1) = x0 * s + x1 * c;
    }
  }
}

/// The normalised row form of the released codes, 1 / (S + n eps): eps = 0 is normalised_row
/// (degenerate where S is zero or tiny); eps > 0 is degenerate only where the denominator is 0.
inline RowForm eps_normalised_row(double S, int n_kept, double magnitude, double eps) {
  if (eps == 0.0) return normalised_row(S, n_kept, magnitude);
  const double denominator = S + static_cast<double>(n_kept) * eps;
  if (n_kept == 0 || denominator == 0.0) return {};
  return {1.0 / denominator, 0.0, false};
}

/// The released codes' denominator eps per key: 1e-6 in the code convention, 0 in the paper's.
inline double released_eps(const Variant& v) {
  return v.convention == Convention::Paper ? 0.0 : 1e-6;
}

/// The form MLLA and RALA share (MLLA's, with RALA's re-weighted keys): phi = ELU + 1 on the
/// queries, keys k'_j = base_keys(k) (MLLA: phi(k); RALA: its re-weighting), the head's 2-D RoPE R
/// in the numerator only, w_ij = R phi(q_i).R k'_j / (sum_m phi(q_i).k'_m + N eps), eps the
/// released codes' 1e-6 per key in the code convention. A family deriving from it names itself
/// and gives its keys; its maths stays in its own file.
class RopeNumeratorFamily : public KernelFamily {
 public:
  MapRule map_rule() const override { return MapRule::None; }
  std::vector<std::string_view> params(const Variant& /*v*/) const override {
    return {"rope_cos", "rope_sin"};
  }
  bool rows_sum_to_one(const Variant& /*v*/) const override { return false; }
  bool position_dependent() const override { return true; }
  bool weights_can_be_negative() const override { return true; }
  std::vector<MagnitudeLaw> magnitude_laws() const override {
    return {MagnitudeLaw::LinearInvariant};
  }
  int feature_dim(const Variant& /*v*/, int d) const override { return d; }
  void query_features(const Variant& v, ConstRef<double> q, TokenPositions positions,
                      Eigen::Index n_keys, double /*scale*/, Eigen::Ref<MatD> out) const override {
    const RopeTables rope = rope_tables(v, n_keys, q.cols());
    elu1_into(q, 1.0, out);
    rotate_rows(rope, positions, out);
  }
  void key_features(const Variant& v, ConstRef<double> q, ConstRef<double> k, double scale,
                    Eigen::Ref<MatD> out) const override {
    const RopeTables rope = rope_tables(v, k.rows(), k.cols());
    base_keys(v, q, k, scale, out);
    rotate_rows(rope, TokenPositions{}, out);
  }
  bool separate_normaliser(const Variant& /*v*/) const override { return true; }
  void normaliser_query_features(const Variant& /*v*/, ConstRef<double> q,
                                 TokenPositions /*positions*/, Eigen::Index /*n_keys*/,
                                 double /*scale*/, Eigen::Ref<MatD> out) const override {
    elu1_into(q, 1.0, out);
  }
  void normaliser_key_features(const Variant& v, ConstRef<double> q, ConstRef<double> k,
                               double scale, Eigen::Ref<MatD> out) const override {
    base_keys(v, q, k, scale, out);
  }
  RowForm row_form(double S, int n_kept, double magnitude) const override {
    return normalised_row(S, n_kept, magnitude);
  }
  RowForm variant_row_form(const Variant& v, double S, int n_kept,
                           double magnitude) const override {
    return eps_normalised_row(S, n_kept, magnitude, released_eps(v));
  }
  bool has_offset() const override { return false; }
  bool query_features_homogeneous(const Variant& /*v*/) const override { return false; }

 protected:
  /// The keys before the rotation (N x d into out), from the head's keys k (and its queries q and
  /// scale, where the family's keys depend on them).
  virtual void base_keys(const Variant& v, ConstRef<double> q, ConstRef<double> k, double scale,
                         Eigen::Ref<MatD> out) const = 0;
};

}  // namespace attnscope::detail
