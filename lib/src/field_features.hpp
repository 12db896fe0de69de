// Library-internal pieces of the families of the field (lib/src/families/mlla.cpp, rala.cpp,
// mala.cpp's code+rope, polaformer.cpp, agent.cpp): ELU + 1 and the rotation of features by a
// head's stored RoPE cosines and sines. Nothing here knows a family's formula.
#pragma once

#include <string>

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

}  // namespace attnscope::detail
