// The error bound of the float softmax rows behind `distance` and `entropy`
// (analyses/src/float_softmax_rows.hpp) for one head, for the tests that compare those paths with
// their double references.
#pragma once

#include "../../analyses/src/float_softmax_rows.hpp"
#include "attnscope/variant.hpp"

#include <cmath>

namespace attnscope::test {

struct FloatRowsBound {
  bool used = false;   ///< the head is measured in float (softmax within the float range)
  double delta = 0.0;  ///< the logit error bound
  double r = 0.0;      ///< every exponential's relative error bound (exp_relative_error)
};

/// Whether the fast path measures this head in float, and its bounds.
inline FloatRowsBound float_rows_bound(const Variant& v, const MatF& q, const MatF& k,
                                       double scale) {
  FloatRowsBound b;
  if (v.linear_time_outputs()) return b;
  analyses::detail::FloatSoftmaxRows ws;
  b.used = analyses::detail::float_softmax_rows(q, k, scale, 0, false, ws);
  b.delta = ws.delta;
  b.r = analyses::detail::exp_relative_error(b.delta);
  return b;
}

}  // namespace attnscope::test
