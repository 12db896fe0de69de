// Library-internal: feature maps applied to a view, with the convention's factor folded in.
#pragma once

#include "attnscope/feature_map.hpp"

namespace attnscope::detail {

/// factor * phi(x), row-wise; x is n x d. Throws NumericalError naming the row on a non-finite
/// result. relu_affine parameters are drawn from the map's seed when A is unset or of wrong width.
template <typename T>
Mat<T> apply_feature_map(const FeatureMap& map, ConstRef<T> x, double factor = 1.0);

/// The same, written into y (x.rows() x out_dim), which must not alias x: no allocation beyond
/// relu_affine's parameters when they have to be drawn.
template <typename T>
void apply_feature_map_into(const FeatureMap& map, ConstRef<T> x, double factor,
                            Eigen::Ref<Mat<T>> y);

}  // namespace attnscope::detail
