// Plain-loop references (reference.hpp).
#include "reference.hpp"

#include "attnscope/error.hpp"

#include <cmath>
#include <cstdlib>
#include <limits>

namespace attnscope::reference {
namespace {

double scalar_map(const FeatureMap& map, double x) {
  switch (map.kind) {
    case MapKind::Identity:
      return x;
    case MapKind::Relu:
      return x > 0.0 ? x : 0.0;
    case MapKind::LeakyRelu:
      return x > 0.0 ? x : map.slope * x;
    case MapKind::Elu1:  // ELU(x) + 1, where ELU(x) = exp(x) - 1 for x <= 0
      return x > 0.0 ? x + 1.0 : std::exp(x);
    case MapKind::Exp:
      return std::exp(x);
    case MapKind::ReluAffine:
    case MapKind::Focused:
      break;
  }
  return 0.0;
}

/// FLatten's focused map, row by row: (|r| / |r^P|) r^P, r = ReLU(x); a zero r maps to 0. The
/// powers are taken of r / max r (the quotient is unchanged, and nothing overflows).
MatD focused(double power, const MatD& x) {
  MatD y = MatD::Zero(x.rows(), x.cols());
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    double top = 0.0;
    for (Eigen::Index t = 0; t < x.cols(); ++t) top = std::max(top, x(i, t));
    if (top == 0.0) continue;
    double r2 = 0.0, p2 = 0.0;
    for (Eigen::Index t = 0; t < x.cols(); ++t) {
      const double r = x(i, t) > 0.0 ? x(i, t) / top : 0.0;
      const double p = std::pow(r, power);
      y(i, t) = p;
      r2 += r * r;
      p2 += p * p;
    }
    const double factor = top * std::sqrt(r2) / std::sqrt(p2);
    for (Eigen::Index t = 0; t < x.cols(); ++t) y(i, t) *= factor;
  }
  return y;
}

/// ReLU(A x + b) for every row, with explicit loops.
MatD relu_affine(const MatD& A, const VecD& b, const MatD& x) {
  MatD y(x.rows(), A.rows());
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    for (Eigen::Index o = 0; o < A.rows(); ++o) {
      double s = b(o);
      for (Eigen::Index t = 0; t < x.cols(); ++t) s += A(o, t) * x(i, t);
      y(i, o) = s > 0.0 ? s : 0.0;
    }
  }
  return y;
}

}  // namespace

MatD feature_map(const FeatureMap& map, const MatD& x) {
  if (map.kind == MapKind::ReluAffine) {
    FeatureMap with_params = map;
    with_params.ensure_params(static_cast<int>(x.cols()));
    return relu_affine(with_params.A, with_params.b, x);
  }
  if (map.kind == MapKind::Focused) return focused(map.power, x);
  MatD y(x.rows(), x.cols());
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    for (Eigen::Index t = 0; t < x.cols(); ++t) y(i, t) = scalar_map(map, x(i, t));
  }
  return y;
}

#define ATTNSCOPE_FAMILY(name)                                                               \
  MatD weights_##name(const Variant& v, const MatD& q, const MatD& k, double scale,                \
                      const Mask* mask, std::vector<int>& degenerate);
#include "reference_list.inc"
#undef ATTNSCOPE_FAMILY

bool has_weights(std::string_view family) {
#define ATTNSCOPE_FAMILY(name) \
  if (family == #name) return true;
#include "reference_list.inc"
#undef ATTNSCOPE_FAMILY
  return false;
}

MatD weights(const Variant& v, const MatD& q, const MatD& k, double scale, const Mask* mask,
             std::vector<int>* degenerate) {
  std::vector<int> rows;
  const std::string_view family = v.family->name();
#define ATTNSCOPE_FAMILY(name)                                                      \
  if (family == #name) {                                                            \
    MatD w = weights_##name(v, q, k, scale, mask, rows);                            \
    if (degenerate) *degenerate = rows;                                             \
    return w;                                                                       \
  }
#include "reference_list.inc"
#undef ATTNSCOPE_FAMILY
  throw UsageError("no reference for the attention family '" + std::string(family) + "'");
}

MatD outputs(const Variant& v, const MatD& q, const MatD& k, const MatD& values, double scale,
             const Mask* mask, std::vector<int>* degenerate) {
  const MatD w = weights(v, q, k, scale, mask, degenerate);
  MatD out = MatD::Zero(q.rows(), values.cols());
  for (Eigen::Index i = 0; i < w.rows(); ++i) {
    for (Eigen::Index j = 0; j < w.cols(); ++j) {
      for (Eigen::Index c = 0; c < values.cols(); ++c) out(i, c) += w(i, j) * values(j, c);
    }
  }
  return out;
}

MatD query_transform(const QueryTransform& t, const MatD& q, int* zero_rows) {
  if (zero_rows) *zero_rows = 0;
  if (t.kind == QueryTransformKind::None) return q;
  MatD y(q.rows(), q.cols());
  if (t.kind == QueryTransformKind::F2) {
    MatD A;
    VecD b;
    if (t.A.rows() == q.cols() && t.A.cols() == q.cols() && t.b.size() == q.cols()) {
      A = t.A;
      b = t.b;
    } else {
      draw_affine_params(t.seed, static_cast<int>(q.cols()), A, b);
    }
    y = relu_affine(A, b, q);
  } else {
    for (Eigen::Index i = 0; i < q.rows(); ++i) {
      for (Eigen::Index c = 0; c < q.cols(); ++c) {
        const double x = q(i, c);
        y(i, c) = t.kind == QueryTransformKind::F1 && x < 0.0 ? 0.0 : x;
      }
    }
  }
  for (Eigen::Index i = 0; i < y.rows(); ++i) {
    double norm2 = 0.0;
    for (Eigen::Index c = 0; c < y.cols(); ++c) norm2 += y(i, c) * y(i, c);
    const double norm = std::sqrt(norm2);
    for (Eigen::Index c = 0; c < y.cols(); ++c) y(i, c) = norm > 0.0 ? y(i, c) / norm : 0.0;
    if (norm == 0.0 && zero_rows) ++*zero_rows;
  }
  return y;
}

std::vector<int> window(const TokenGrid& grid, int token, int k) {
  std::vector<int> out;
  if (!grid.on_grid(token)) return out;
  const int half = k / 2;
  for (int t = grid.prefix; t < grid.tokens(); ++t) {
    const int dr = std::abs((t - grid.prefix) / grid.width - (token - grid.prefix) / grid.width);
    const int dc = std::abs((t - grid.prefix) % grid.width - (token - grid.prefix) % grid.width);
    if (dr <= half && dc <= half) out.push_back(t);
  }
  return out;
}

Mask local_window_mask(const TokenGrid& grid, int k) {
  const int n = grid.tokens();
  Mask mask = Mask::Constant(n, n, true);
  for (int i = grid.prefix; i < n; ++i) {
    for (int j : window(grid, i, k)) mask(i, j) = false;
  }
  return mask;
}

}  // namespace attnscope::reference
