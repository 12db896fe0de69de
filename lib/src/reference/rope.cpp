// Plain-loop RoPE of the references (reference.hpp): rotations by stored cosines and sines, and
// the released codes' angle layouts of a token grid.
#include "field_support.hpp"
#include "reference.hpp"

#include <cmath>

namespace attnscope::reference {

Rotation rotation_from_angles(const MatD& angles) {
  Rotation r{MatD(angles.rows(), angles.cols()), MatD(angles.rows(), angles.cols())};
  for (Eigen::Index t = 0; t < angles.rows(); ++t) {
    for (Eigen::Index p = 0; p < angles.cols(); ++p) {
      r.cos(t, p) = std::cos(angles(t, p));
      r.sin(t, p) = std::sin(angles(t, p));
    }
  }
  return r;
}

MatD rotate(const Rotation& rotation, const MatD& x) {
  if (x.cols() % 2 != 0) {
    throw UsageError("rotate: head_dim " + std::to_string(x.cols()) +
                     " is odd; RoPE turns channel pairs (2p, 2p+1)");
  }
  field::expect_shape("rotate", "cos", rotation.cos, x.rows(), x.cols() / 2);
  field::expect_shape("rotate", "sin", rotation.sin, x.rows(), x.cols() / 2);
  MatD y(x.rows(), x.cols());
  for (Eigen::Index t = 0; t < x.rows(); ++t) {
    for (Eigen::Index p = 0; p < x.cols() / 2; ++p) {
      const double c = rotation.cos(t, p), s = rotation.sin(t, p);
      const double x0 = x(t, 2 * p), x1 = x(t, 2 * p + 1);
      y(t, 2 * p) = x0 * c - x1 * s;
      y(t, 2 * p + 1) = x0 * s + x1 * c;
    }
  }
  return y;
}

MatD rope_angles(RopeLayout layout, int grid_h, int grid_w, int head_dim, int head, int num_heads,
                 double base) {
  if (grid_h < 1 || grid_w < 1 || head_dim < 4 || head_dim % 4 != 0 || num_heads < 1 || head < 0 ||
      head >= num_heads) {
    throw UsageError(
        "rope_angles: needs a grid of at least 1x1, head_dim a positive multiple of 4"
        " and 0 <= head < num_heads; got " +
        std::to_string(grid_h) + "x" + std::to_string(grid_w) + ", head_dim " +
        std::to_string(head_dim) + ", head " + std::to_string(head) + " of " +
        std::to_string(num_heads));
  }
  const int pairs = head_dim / 2;
  MatD angles(static_cast<Eigen::Index>(grid_h) * grid_w, pairs);
  for (int r = 0; r < grid_h; ++r) {
    for (int c = 0; c < grid_w; ++c) {
      const Eigen::Index t = static_cast<Eigen::Index>(r) * grid_w + c;
      for (int p = 0; p < pairs; ++p) {
        double angle = 0.0;
        if (layout == RopeLayout::Mlla) {
          const int k_max = num_heads * head_dim / 4;  // over the layer's channels
          const int P = head * pairs + p;
          const int m = P < k_max ? P : P - k_max;
          angle = (P < k_max ? r : c) * std::pow(base, -static_cast<double>(m) / k_max);
        } else {
          const int f = head_dim / 4;  // per head
          const int m = p < f ? p : p - f;
          const double frac = f > 1 ? static_cast<double>(m) / (f - 1) : 0.0;
          angle = (p < f ? r : c) * std::pow(base, -frac);
        }
        angles(t, p) = angle;
      }
    }
  }
  return angles;
}

MatD apply_weights(const MatD& w, const MatD& v) {
  if (w.cols() != v.rows()) {
    throw UsageError("apply_weights: W has " + std::to_string(w.cols()) + " columns, V " +
                     std::to_string(v.rows()) + " rows");
  }
  return field::product(w, v);
}

}  // namespace attnscope::reference
