// The reference row of a magnitude sweep: query q of token `token` scaled by a, in the sweep's
// space, from the plain-loop references only.
#pragma once

#include "attnscope/analyses/spikiness.hpp"
#include "reference.hpp"

#include <stdexcept>

namespace attnscope::test {

/// Reference row of query q placed at token position `token` (the rows before it are filler: every
/// reference row depends on its own query, its position and the keys only).
inline VecD reference_row_at(const Variant& v, const VecD& q, Eigen::Index token, const MatD& k,
                             double scale) {
  MatD queries(token + 1, q.size());
  queries.rowwise() = q.transpose();
  return reference::weights(v, queries, k, scale).row(token).transpose();
}

/// Query space: the family on a q. Feature space: for a family with a feature map, the
/// identity-map family on a phi(q) and phi(K) (the convention's factor applied by the reference
/// to both); for a normalised family without one (no offset: a = 1/S), the row at a = 1, which
/// scaling f_q leaves unchanged.
inline VecD reference_sweep_row(const Variant& v, analyses::ScaleSpace space, const VecD& q,
                                Eigen::Index token, double a, const MatD& k, double scale) {
  if (!v.linear_time_outputs() || space == analyses::ScaleSpace::Query) {
    return reference_row_at(v, a * q, token, k, scale);
  }
  if (v.uses_map()) {
    Variant twin = v;
    twin.map = FeatureMap{};
    const MatD phi_q = reference::feature_map(v.map, MatD(q.transpose()));
    return reference_row_at(twin, VecD(a * phi_q.row(0).transpose()), token,
                            reference::feature_map(v.map, k), scale);
  }
  if (!v.kernel()->has_offset()) return reference_row_at(v, q, token, k, scale);
  throw std::logic_error(v.name() + ": no feature-space reference");
}

}  // namespace attnscope::test
