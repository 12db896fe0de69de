// Plain-loop, double-precision references of the attention library, kept forever for tests.
//
// One file per family under families/ (weights_<name>), written from the papers' formulas entry
// by entry (no Eigen products, no shared code with the fast paths beyond the parameter drawing of
// relu_affine / f2, and no use of the family registry's maths), so that a test comparing the two
// checks the algebra of the fast paths (the affine row form, the linear-time outputs) as well as
// their arithmetic. Degenerate rows follow the library's policy: weights and outputs 0, the row
// listed in `degenerate` (sorted).
#pragma once

#include "attnscope/attention.hpp"
#include "attnscope/feature_map.hpp"
#include "attnscope/layout.hpp"
#include "attnscope/query_transform.hpp"
#include "attnscope/variant.hpp"

#include <string_view>
#include <vector>

namespace attnscope::reference {

/// phi applied entry by entry (relu_affine: the map's A, b, drawn from its seed when unset).
MatD feature_map(const FeatureMap& map, const MatD& x);

/// Whether the family has a reference (lib/src/reference/families/<name>.cpp).
bool has_weights(std::string_view family);

/// Explicit attention weights, one entry at a time, by the family's own reference file. Throws
/// UsageError for a family that has none.
MatD weights(const Variant& v, const MatD& q, const MatD& k, double scale,
             const Mask* mask = nullptr, std::vector<int>* degenerate = nullptr);

/// o_i = sum_j w_ij v_j with the weights above.
MatD outputs(const Variant& v, const MatD& q, const MatD& k, const MatD& values, double scale,
             const Mask* mask = nullptr, std::vector<int>* degenerate = nullptr);

/// The query transforms f1, f2, l2norm, none; `zero_rows` counts rows with a zero normaliser.
MatD query_transform(const QueryTransform& t, const MatD& q, int* zero_rows = nullptr);

/// Grid tokens within Chebyshev distance k/2 of `token`, by scanning the whole grid.
std::vector<int> window(const TokenGrid& grid, int token, int k);

/// local_window_mask by grid coordinates: grid query i loses key j when both are on the grid and
/// their rows and columns differ by at most k/2.
Mask local_window_mask(const TokenGrid& grid, int k);

}  // namespace attnscope::reference
