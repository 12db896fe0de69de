// The candidate filter of the GPU confusion count, and why it never misses a confused pair.
//
// The GPU computes every attention row in double (w^_i) and every pair's squared distance through
// the Gram matrix, d^2_ij = n_i + n_j - 2 g_ij (n_i = g_ii, G = W W^T by cuBLAS). It proposes the
// pairs with d^2_ij <= threshold(i, j) below; the CPU then decides each proposed pair with the
// exact judge (confusion.hpp), so the count is the CPU's count as long as every pair the judge
// accepts is proposed. The bound that guarantees it (u = 2^-53, gamma_k = k u / (1 - k u)):
//
//  1. The judge accepts (i, j) when fl(sum_t (w~_it - w~_jt)^2) <= eps^2 on the CPU's exact rows
//     w~. A sum of non-negative rounded terms is at least (1 - gamma_{N+2}) times the true sum, so
//     an accepted pair has |w~_i - w~_j| <= eps (1 + gamma_{N+2}) =: eps'.
//  2. Row error: |w^_i - w~_i| <= R_i (row_bound_softmax / row_bound_kernel below: each row is
//     within R_i / 2 of the real-arithmetic row, for the GPU and for the CPU alike, whatever
//     order either sums in). Then |w^_i - w^_j| <= eps' + R_i + R_j.
//  3. Gram error: any summation order of a dot product of N terms errs by at most
//     gamma_N sum_t |x_t y_t| <= gamma_N |x| |y| (Cauchy-Schwarz), so with n_i = |w^_i|^2,
//     |d^2 - |w^_i - w^_j|^2| <= gamma_N (n_i + n_j + 2 sqrt(n_i n_j)) + 3u (n_i + n_j + 2|g_ij|)
//     <= (2 gamma_N + 6u)(n_i + n_j)(1 + gamma_N) =: G_ij (up to second-order terms).
//  Hence an accepted pair has d^2 <= (eps' + R_i + R_j)^2 + G_ij. The threshold doubles G_ij and
//  inflates the result by 16u, so that the rounding of its own evaluation cannot undercut it.
//  NaN or infinite inputs to the test make a pair a candidate (`!(d2 > threshold)`): the filter
//  can only ever propose too much.
//
// Floating-point model: IEEE double, round to nearest, no reassociation of the bounds' own
// arithmetic. The host compiles them without contraction (-ffp-contract=off, checked through
// portable::probe::candidate_margin); nvcc contracts on the device, which only makes the rows and
// the Gram matrix more accurate: the row and Gram bounds above hold for any order of summation and
// for fused or unfused steps alike. Underflow is covered explicitly (kUnderflow below): the bounds
// stay rigorous for subnormal features. The CPU's judge decides every count (portable_math.hpp).
//
// Everything here is plain arithmetic, compiled for the host (tests) and the device (kernels).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#ifdef __CUDACC__
#define ATTNSCOPE_HOST_DEVICE __host__ __device__
#else
#define ATTNSCOPE_HOST_DEVICE
#endif

namespace attnscope::margin {

/// Unit roundoff of double.
inline constexpr double kUnit = 1.1102230246251565e-16;  // 2^-53

/// gamma_k = k u / (1 - k u); infinite when k u >= 1.
ATTNSCOPE_HOST_DEVICE inline double gamma(double k) {
  const double ku = k * kUnit;
  return ku < 1.0 ? ku / (1.0 - ku) : HUGE_VAL;
}

/// R_i for a softmax row of N keys from queries and keys of dimension d, with
/// logit_bound = |s| |q_i| max_j |k_j| (an upper bound of every |logit| of the row).
/// Logits err by at most delta = gamma_{d+1} L (a d-term dot product, then the scale); the
/// subtraction of the max by 2uL (|x - max| <= 2L); so exp's argument by delta' = delta + 2uL(1 +
/// gamma). exp errs by at most 1 ulp (<= 2u relative; CUDA's and glibc's double exp both do), the
/// sum of N terms by gamma_{N-1}, the division by u. Every entry is then w_j (1 + theta) with
/// |theta| <= rho = e^{2 delta'} (1 + 2u) / (1 - 2u) (1 + u) / (1 - gamma_{N-1}) - 1, and as rows
/// sum to 1, |w|_2 <= 1: each of the two rows (GPU, CPU) is within rho of the true one, R = 2 rho.
/// Doubled once more for safety: the bound costs nothing at the sizes of interest (~1e-13).
ATTNSCOPE_HOST_DEVICE inline double row_bound_softmax(double logit_bound, int n, int d) {
  const double L = logit_bound;
  const double delta = gamma(d + 1.0) * L + 2.0 * kUnit * L * (1.0 + gamma(d + 1.0));
  const double g = gamma(n - 1.0);
  if (!(g < 1.0)) return HUGE_VAL;
  const double rho = std::exp(2.0 * delta) * (1.0 + 2.0 * kUnit) / (1.0 - 2.0 * kUnit) * (1.0 + kUnit) /
                         (1.0 - g) - 1.0;
  return 4.0 * rho;
}

/// Smallest positive subnormal double, 2^-1074: an upper bound of the absolute error of one
/// operation whose result underflows (round to nearest errs by at most half of it).
inline constexpr double kUnderflow = 4.9406564584124654e-324;

/// R_i for a kernel-form row w_ij = a_i f_q(i).f_k(j) + b_i with the same double a_i, b_i, f_q,
/// f_k on both sides (ExactRows's): an r-term dot product, a product and a sum err by at most
/// gamma_{r+2} (|a_i| sum_t |f_q(i)_t f_k(j)_t| + |b_i|) per entry, in L2 over the N entries at
/// most gamma_{r+2} (|a_i| |f_q(i)| |F_k|_F + sqrt(N) |b_i|); twice that for the two sides,
/// doubled for safety. Products that underflow (subnormal features: exp of a large negative
/// number) err absolutely, by at most 2^-1074 each: (r + 1) of them per dot product, scaled by
/// |a_i|, and one more for the product by a_i, per entry (none when a_i = 0: the row is b_i). The
/// norms must not underflow either: take them scaled (confusion_cuda.cpp), never as sqrt(sum x^2),
/// whose squares of tiny features are 0.
ATTNSCOPE_HOST_DEVICE inline double row_bound_kernel(double a, double b, double fq_norm, double fk_frobenius,
                                                     int n, int r) {
  const double rounding = gamma(r + 2.0) * (std::fabs(a) * fq_norm * fk_frobenius + std::sqrt(double(n)) * std::fabs(b));
  // A zero coefficient makes a_i f_q.f_k exactly 0: nothing underflows.
  const double per_entry = a == 0.0 ? 0.0 : std::fabs(a) * ((r + 1.0) * kUnderflow) + kUnderflow;
  const double underflow = std::sqrt(double(n)) * per_entry * (1.0 + gamma(r + 2.0));
  return 4.0 * (rounding + underflow);
}

/// The largest d^2_ij (from the Gram matrix) a pair may show and still be confused: see the
/// header comment. n_i, n_j: the Gram diagonal; r_i, r_j: the row bounds; N: row length.
ATTNSCOPE_HOST_DEVICE inline double pair_threshold(double eps, double n_i, double n_j, double r_i, double r_j,
                                                   int n) {
  const double eps_judge = eps * (1.0 + gamma(n + 2.0));
  const double reach = eps_judge + r_i + r_j;
  const double gn = gamma(double(n));
  const double gram = 2.0 * (2.0 * gn + 6.0 * kUnit) * (std::fabs(n_i) + std::fabs(n_j)) * (1.0 + gn);
  return (reach * reach + gram) * (1.0 + 16.0 * kUnit);
}

/// The Gram-matrix squared distance as the candidate kernel evaluates it.
ATTNSCOPE_HOST_DEVICE inline double gram_distance2(double n_i, double n_j, double g_ij) {
  return (n_i + n_j) - 2.0 * g_ij;
}

/// The filter: true when (i, j) must go to the exact judge (NaN anywhere: true).
ATTNSCOPE_HOST_DEVICE inline bool is_candidate(double eps, double n_i, double n_j, double g_ij, double r_i,
                                               double r_j, int n) {
  return !(gram_distance2(n_i, n_j, g_ij) > pair_threshold(eps, n_i, n_j, r_i, r_j, n));
}

/// A candidate as the kernel writes it: head of the batch, rows i < j.
struct CandidatePair {
  std::int32_t head;
  std::int32_t i;
  std::int32_t j;
};

/// The pairs of a batch's heads, sorted per head by (i, j): the kernel appends them in whatever
/// order its threads finish, so this makes the judge's work (and its row cache's order)
/// independent of scheduling. Throws std::out_of_range on a head index outside [0, heads).
std::vector<std::vector<std::pair<int, int>>> split_by_head(const std::vector<CandidatePair>& pairs, int heads);

/// Capacity (pairs) for a retry after the kernel counted `needed` candidates into a buffer of
/// `capacity`: the count is exact (the kernel counts past the end without writing), so one retry
/// of at least `needed` suffices; rounded up to a power of two (no shrinking).
std::int64_t retry_capacity(std::int64_t needed, std::int64_t capacity);

/// Heads per launch: as many as fit in `budget_bytes` of device memory, each needing
/// `bytes_per_head`, at least 1 and at most `heads`.
int heads_per_launch(std::int64_t heads, std::int64_t bytes_per_head, std::int64_t budget_bytes);

}  // namespace attnscope::margin
