// The papers' confusion-inducing query maps, applied to queries before any attention family
// (InLine Table 1, MALA Table 1). Spec strings: "none", "f1", "f2", "l2norm".
//   f1(q) = ReLU(q) / |ReLU(q)|
//   f2(q) = ReLU(A q + b) / |ReLU(A q + b)|     A (d x d), b (d) drawn from the seed like relu_affine
//   l2norm(q) = q / |q|
// A zero denominator leaves the row at zero and counts it in `zero_rows` of apply's result.
#pragma once

#include "attnscope/layout.hpp"

#include <cstdint>
#include <string>
#include <string_view>

namespace attnscope {

enum class QueryTransformKind { None, F1, F2, L2Norm };

struct QueryTransform {
  QueryTransformKind kind = QueryTransformKind::None;
  std::uint64_t seed = 0;
  MatD A;  ///< f2 only, drawn lazily for the query dimension
  VecD b;

  [[nodiscard]] std::string name() const;
  [[nodiscard]] bool is_identity() const { return kind == QueryTransformKind::None; }
  /// Applies the transform to every row of q (n x d). `zero_rows`, if given, receives the number
  /// of rows whose normaliser was zero.
  template <typename T>
  [[nodiscard]] Mat<T> apply(ConstRef<T> q, int* zero_rows = nullptr) const;
};

[[nodiscard]] QueryTransform parse_query_transform(std::string_view spec, std::uint64_t seed = 0);

}  // namespace attnscope
