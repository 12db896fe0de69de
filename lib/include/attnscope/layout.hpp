// The one statement of attnscope's data layout. Every API relies on it.
//
// * Matrices are row-major. An n x d matrix x stores element (i, j) at x[i*d + j].
// * One image of a dump is [layer][head][token][dim], row-major: for a fixed layer and head the
//   tokens are the rows of an N x d matrix (Q, K or V of that head).
// * Token order: the prefix tokens (CLS, distillation token, ...) come first, then the patch grid
//   row by row: token t >= prefix sits at grid row (t - prefix) / width, column (t - prefix) % width.
// * Attention weights are an N x N matrix W, row i = query i, column j = key j.
#pragma once

#include <Eigen/Core>

#include <cstddef>
#include <vector>

namespace attnscope {

template <typename T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using Vec = Eigen::Matrix<T, Eigen::Dynamic, 1>;
using MatD = Mat<double>;
using MatF = Mat<float>;
using VecD = Vec<double>;
using VecF = Vec<float>;
/// Read-only view of any row-major block (a head's rows of a larger matrix binds without a copy).
template <typename T>
using ConstRef = Eigen::Ref<const Mat<T>>;
/// Per-query key masks: kept(i, j) == true when key j stays visible to query i (how each form
/// renormalises over the kept keys: attention.hpp).
using Mask = Eigen::Array<bool, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Where tokens sit: `prefix` tokens that are not on the grid, then a height x width patch grid.
struct TokenGrid {
  int prefix = 0;
  int height = 0;
  int width = 0;

  [[nodiscard]] int tokens() const { return prefix + height * width; }
  [[nodiscard]] bool on_grid(int token) const { return token >= prefix && token < tokens(); }
  /// Grid row of a grid token. Precondition: on_grid(token).
  [[nodiscard]] int row(int token) const { return (token - prefix) / width; }
  /// Grid column of a grid token. Precondition: on_grid(token).
  [[nodiscard]] int col(int token) const { return (token - prefix) % width; }
  /// Token index of grid cell (r, c). Precondition: 0 <= r < height, 0 <= c < width.
  [[nodiscard]] int token(int r, int c) const { return prefix + r * width + c; }

  /// Grid rows [row_lo, row_hi] x columns [col_lo, col_hi] of a clipped window; empty (no rows)
  /// for a prefix token.
  struct WindowSpan {
    int row_lo = 0, row_hi = -1, col_lo = 0, col_hi = -1;
    [[nodiscard]] int cells() const { return (row_hi - row_lo + 1) * (col_hi - col_lo + 1); }
  };
  /// The cells of the k x k window centred on `token` (k odd), clipped at the borders: window()'s
  /// tokens are token(r, c) for r, then c, in these ranges, for loops that build no list.
  [[nodiscard]] WindowSpan window_span(int token, int k) const;
  /// visit(j) for each token j of window(token, k), in that order, building no list; returns the
  /// window's cells.
  template <typename Visit>
  int for_each_in_window(int token, int k, Visit&& visit) const {
    const WindowSpan span = window_span(token, k);
    for (int r = span.row_lo; r <= span.row_hi; ++r) {
      for (int c = span.col_lo; c <= span.col_hi; ++c) visit(this->token(r, c));
    }
    return span.cells();
  }
  /// Grid tokens of the k x k window centred on `token` (k odd), the token itself included,
  /// clipped at the borders, in token order. Empty for a prefix token.
  [[nodiscard]] std::vector<int> window(int token, int k) const;
  /// The window without the token itself.
  [[nodiscard]] std::vector<int> neighbours(int token, int k) const;
  /// Number of grid cells in the clipped k x k window of `token` (0 for prefix tokens).
  [[nodiscard]] int window_size(int token, int k) const;
};

}  // namespace attnscope
