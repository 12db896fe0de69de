// Plain-loop references (reference.hpp).
#include "reference.hpp"

#include <cmath>
#include <cstdlib>
#include <limits>

namespace attnscope::reference {
namespace {

double dot(const MatD& a, Eigen::Index i, const MatD& b, Eigen::Index j) {
  double s = 0.0;
  for (Eigen::Index t = 0; t < a.cols(); ++t) s += a(i, t) * b(j, t);
  return s;
}

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
      break;
  }
  return 0.0;
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

bool kept(const Mask* mask, Eigen::Index i, Eigen::Index j) { return mask == nullptr || (*mask)(i, j); }

/// Softmax row i over kept keys; false when no key is kept.
bool softmax_row(const MatD& q, const MatD& k, double scale, const Mask* mask, Eigen::Index i,
                 MatD& w) {
  bool any = false;
  double top = 0.0;
  for (Eigen::Index j = 0; j < k.rows(); ++j) {
    if (!kept(mask, i, j)) continue;
    const double logit = scale * dot(q, i, k, j);
    if (!any || logit > top) top = logit;
    any = true;
  }
  if (!any) return false;
  double total = 0.0;
  for (Eigen::Index j = 0; j < k.rows(); ++j) {
    w(i, j) = kept(mask, i, j) ? std::exp(scale * dot(q, i, k, j) - top) : 0.0;
    total += w(i, j);
  }
  for (Eigen::Index j = 0; j < k.rows(); ++j) w(i, j) /= total;
  return true;
}

/// Linear / InLine / MALA row i from phi(q), phi(k) (convention factor included); false when
/// the row is degenerate.
bool kernel_row(Family family, const MatD& fq, const MatD& fk, const Mask* mask, Eigen::Index i,
                MatD& w) {
  int n = 0;
  double S = 0.0;  // phi(q_i) . sum_kept phi(k_m)
  for (Eigen::Index m = 0; m < fk.rows(); ++m) {
    if (!kept(mask, i, m)) continue;
    ++n;
    S += dot(fq, i, fk, m);
  }
  if (n == 0) return false;
  double q_norm2 = 0.0, ksum_norm2 = 0.0;
  for (Eigen::Index t = 0; t < fq.cols(); ++t) {
    double ks = 0.0;
    for (Eigen::Index m = 0; m < fk.rows(); ++m) {
      if (kept(mask, i, m)) ks += fk(m, t);
    }
    ksum_norm2 += ks * ks;
    q_norm2 += fq(i, t) * fq(i, t);
  }
  if (!std::isfinite(S) || !std::isfinite(q_norm2) || !std::isfinite(ksum_norm2)) {
    // Overflow: the row has no value in double. NaN, so that no caller takes it for a result
    // (the tiny rule below would call it degenerate).
    for (Eigen::Index j = 0; j < fk.rows(); ++j) w(i, j) = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  const bool tiny = !(std::abs(S) > kTinyDenominator * std::sqrt(q_norm2) * std::sqrt(ksum_norm2));
  if (tiny && family != Family::InLine) return false;
  const double inv_n = 1.0 / n;
  const double beta = 1.0 + 1.0 / S;  // MALA eq. 9
  const double gamma = S / n;
  for (Eigen::Index j = 0; j < fk.rows(); ++j) {
    if (!kept(mask, i, j)) {
      w(i, j) = 0.0;
      continue;
    }
    const double qk = dot(fq, i, fk, j);
    switch (family) {
      case Family::Linear:
        w(i, j) = qk / S;
        break;
      case Family::InLine:  // eq. 4
        w(i, j) = qk - inv_n * S + inv_n;
        break;
      case Family::Mala:  // eq. 8
        w(i, j) = beta * qk - gamma;
        break;
      case Family::Softmax:
        break;
    }
  }
  return true;
}

}  // namespace

MatD feature_map(const FeatureMap& map, const MatD& x) {
  if (map.kind == MapKind::ReluAffine) {
    FeatureMap with_params = map;
    with_params.ensure_params(static_cast<int>(x.cols()));
    return relu_affine(with_params.A, with_params.b, x);
  }
  MatD y(x.rows(), x.cols());
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    for (Eigen::Index t = 0; t < x.cols(); ++t) y(i, t) = scalar_map(map, x(i, t));
  }
  return y;
}

MatD weights(const Variant& v, const MatD& q, const MatD& k, double scale, const Mask* mask,
             std::vector<int>* degenerate) {
  MatD w = MatD::Zero(q.rows(), k.rows());
  MatD fq, fk;
  if (v.family != Family::Softmax) {
    // code convention: phi scaled by (s/N)^1/2 with the model's N (the number of keys)
    const double c = v.convention == Convention::Paper
                         ? 1.0
                         : std::sqrt(scale / static_cast<double>(k.rows()));
    fq = c * feature_map(v.map, q);
    fk = c * feature_map(v.map, k);
  }
  if (degenerate) degenerate->clear();
  for (Eigen::Index i = 0; i < q.rows(); ++i) {
    const bool ok = v.family == Family::Softmax ? softmax_row(q, k, scale, mask, i, w)
                                                : kernel_row(v.family, fq, fk, mask, i, w);
    if (!ok) {
      for (Eigen::Index j = 0; j < k.rows(); ++j) w(i, j) = 0.0;
      if (degenerate) degenerate->push_back(static_cast<int>(i));
    }
  }
  return w;
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
