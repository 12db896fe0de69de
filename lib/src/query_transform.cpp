// Confusion-inducing query maps (query_transform.hpp).
#include "attnscope/query_transform.hpp"

#include "attnscope/error.hpp"
#include "attnscope/feature_map.hpp"

#include <array>
#include <cmath>
#include <string>

namespace attnscope {
namespace {

struct TransformEntry {
  std::string_view name;
  QueryTransformKind kind;
};
constexpr std::array<TransformEntry, 4> kTransforms{{{"none", QueryTransformKind::None},
                                                     {"f1", QueryTransformKind::F1},
                                                     {"f2", QueryTransformKind::F2},
                                                     {"l2norm", QueryTransformKind::L2Norm}}};

/// The rows before normalisation: ReLU(q), ReLU(A q + b) or q.
template <typename T>
Mat<T> unnormalised(const QueryTransform& t, ConstRef<T> q) {
  switch (t.kind) {
    case QueryTransformKind::F1:
      return q.cwiseMax(T(0));
    case QueryTransformKind::F2: {
      const int d = static_cast<int>(q.cols());
      MatD A = t.A;
      VecD b = t.b;
      if (A.rows() != d || A.cols() != d || b.size() != d) draw_affine_params(t.seed, d, A, b);
      Mat<T> y = q * A.transpose().cast<T>();
      y.rowwise() += b.transpose().cast<T>();
      return y.cwiseMax(T(0));
    }
    case QueryTransformKind::L2Norm:
    case QueryTransformKind::None:
      break;
  }
  return q;
}

}  // namespace

std::string QueryTransform::name() const {
  for (const auto& e : kTransforms) {
    if (e.kind == kind) return std::string(e.name);
  }
  return "?";
}

template <typename T>
Mat<T> QueryTransform::apply(ConstRef<T> q, int* zero_rows) const {
  if (zero_rows) *zero_rows = 0;
  if (is_identity()) return q;
  // In double whatever T is: A q + b of float queries near FLT_MAX would overflow in float, and
  // the normalised rows always fit (norms are finite in double for any float input).
  MatD y = unnormalised<double>(*this, q.template cast<double>());
  for (Eigen::Index i = 0; i < y.rows(); ++i) {
    const double norm = y.row(i).norm();
    if (!std::isfinite(norm)) {
      throw NumericalError("query transform " + name() + ": row " + std::to_string(i) +
                           " has a non-finite norm (non-finite input)");
    }
    if (norm > 0.0) {
      y.row(i) /= norm;
    } else {
      y.row(i).setZero();
      if (zero_rows) ++*zero_rows;
    }
  }
  return y.template cast<T>();
}

template Mat<float> QueryTransform::apply<float>(ConstRef<float>, int*) const;
template Mat<double> QueryTransform::apply<double>(ConstRef<double>, int*) const;

QueryTransform parse_query_transform(std::string_view spec, std::uint64_t seed) {
  for (const auto& e : kTransforms) {
    if (e.name == spec) {
      QueryTransform t;
      t.kind = e.kind;
      t.seed = seed;
      return t;
    }
  }
  std::string known;
  for (const auto& e : kTransforms) known += (known.empty() ? "" : ", ") + std::string(e.name);
  throw UsageError("unknown query transform '" + std::string(spec) + "'; known: " + known);
}

}  // namespace attnscope
