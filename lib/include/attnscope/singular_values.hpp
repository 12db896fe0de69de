// Singular values of a dense matrix, in a fixed order of operations: the same bits on every CPU,
// vector width and thread count (docs/reliability.md, "Portability"), and several times faster
// than Eigen's BDCSVD under the project's floating-point model (Eigen's own SIMD off).
//
// Method: the matrix (transposed when it has more columns than rows) is scaled by a power of two
// so that its largest entry is in [1/2, 1) (exact: no overflow or underflow of the squares that
// matter), reduced to upper bidiagonal form B by Householder reflections from the left and the
// right (LAPACK's dgebrd, unblocked; a matrix with more than 5/3 as many rows as columns is first
// reduced to the R of its Householder QR, which costs fewer operations), and B's singular values
// come from the dqds algorithm on its squares (Fernando and Parlett; LAPACK's dlasq, with a
// simpler shift), or, where dqds declines (a zero on B's diagonal, no convergence), as the
// non-negative eigenvalues of B's Golub-Kahan tridiagonal (Eigen's tridiagonal QR). The reduction
// is backward stable: every value is within a small multiple of n eps sigma_max of the exact
// one, as BDCSVD's and LAPACK's are (absolute accuracy; small singular values are not accurate
// relative to themselves). Reductions are either one chain in index order or 8 fixed lanes
// combined as a fixed tree; updates are elementwise. tests/unit/test_singular_values.cpp holds it
// against Eigen's one-sided Jacobi SVD.
#pragma once

#include "attnscope/layout.hpp"

#include <vector>

namespace attnscope {

/// The min(rows, cols) singular values of x, largest first (empty for an empty matrix; all 0 for
/// a zero matrix; NaN for a matrix with a NaN or an infinite entry).
[[nodiscard]] std::vector<double> singular_values(const MatD& x);

/// The singular values of x and of [x, 1] (x with a column of ones appended), largest first.
struct SingularPair {
  std::vector<double> x, with_ones;
};
/// Both from one Householder QR of [x, 1] where that pays (x = Q R[:, :n]: the values of x are
/// those of R's leading n x n block), else as singular_values(x) and singular_values([x, 1]).
[[nodiscard]] SingularPair singular_values_with_ones(const MatD& x);

namespace detail {
/// The singular values (in no particular order) of the upper bidiagonal matrix with diagonal d
/// and superdiagonal e (e[k] for k < d.size() - 1; further entries unused), largest entry of at
/// least 1/2: by dqds (false: declined, sigma unusable), and by the Golub-Kahan tridiagonal's QR
/// (NaN where that fails), singular_values' two ways. Exposed for tests.
bool bidiagonal_values_dqds(const std::vector<double>& d, const std::vector<double>& e, std::vector<double>& sigma);
void bidiagonal_values_tridiagonal(const std::vector<double>& d, const std::vector<double>& e,
                                   std::vector<double>& sigma);
}  // namespace detail

}  // namespace attnscope
