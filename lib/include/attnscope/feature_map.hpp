// Feature maps phi applied row-wise to queries and keys of linear-attention families.
#pragma once

#include "attnscope/layout.hpp"

#include <cstdint>
#include <string>
#include <string_view>

namespace attnscope {

enum class MapKind { Identity, Relu, LeakyRelu, Elu1, Exp, ReluAffine, Focused };

/// A feature map by name: identity, relu, leaky_relu (slope), elu1 (ELU(x)+1), exp,
/// relu_affine (ReLU(A x + b); A is d_out x d, b has d_out entries), focused (FLatten's focused
/// map, Han et al. ICCV 2023: phi_P(x) = (|ReLU(x)| / |ReLU(x)^P|) ReLU(x)^P with the power taken
/// entry by entry and the norms over the row; a row whose ReLU is zero maps to zero).
///
/// Spec strings (parse_feature_map): "identity", "relu", "leaky_relu" or "leaky_relu=0.2",
/// "elu1", "exp", "relu_affine" (A, b drawn from the seed given to parse) or
/// "relu_affine=SEED", "focused" (P = 3) or "focused=P" (P > 0). Unknown names throw UsageError
/// listing the known ones.
struct FeatureMap {
  MapKind kind = MapKind::Identity;
  double slope = 0.01;  ///< leaky_relu negative slope
  double power = 3.0;   ///< focused: the power P
  MatD A;               ///< relu_affine only; empty until set or drawn
  VecD b;               ///< relu_affine only
  std::uint64_t seed = 0;  ///< relu_affine: seed that drew A, b when they were not given

  /// Canonical spec string, round-trips through parse_feature_map (A, b by seed).
  [[nodiscard]] std::string name() const;
  /// Whether phi(a x) = a phi(x) for every a > 0 and every x.
  [[nodiscard]] bool positively_homogeneous() const;
  /// Output dimension for input dimension d (d_out = rows of A for relu_affine, else d).
  [[nodiscard]] int out_dim(int d) const;
  /// Draws A (d x d, entries N(0, 1/d)) and b (N(0, 1)) from `seed` for input dimension d
  /// unless A and b are already set with matching width. Deterministic across platforms.
  void ensure_params(int d);

  /// Applies phi to every row of x (n x d) and returns n x out_dim(d).
  /// Throws NumericalError naming the row if a result is not finite (exp overflow).
  template <typename T>
  [[nodiscard]] Mat<T> apply(const Mat<T>& x) const;
};

[[nodiscard]] FeatureMap parse_feature_map(std::string_view spec, std::uint64_t seed = 0);

/// Draws the affine parameters of relu_affine (and of the f2 query transform) from `seed`:
/// A is d x d with entries N(0, 1/d), b has d entries N(0, 1); A row by row, then b. Uses
/// std::mt19937_64 and a Box-Muller transform of its own, so every platform draws the same numbers.
void draw_affine_params(std::uint64_t seed, int d, MatD& A, VecD& b);

/// Names accepted by parse_feature_map, for messages and tests.
[[nodiscard]] std::string known_feature_maps();

}  // namespace attnscope
