// Arithmetic whose results are the same bits on every x86-64 CPU, whatever the build's -march.
//
// The floating-point model the whole project is compiled under (CMakeLists.txt enforces it; see
// docs/reliability.md, "Portability"):
//  - IEEE-754 binary32/binary64, round to nearest even, SSE/AVX registers (never x87);
//  - no contraction: a * b + c is a rounded product, then a rounded sum (-ffp-contract=off), so a
//    CPU with FMA and one without compute the same. A fused multiply-add happens only where the
//    source says std::fma, whose result (the exact a * b + c, rounded once) every CPU computes
//    alike: an instruction where the CPU has FMA, glibc's exact emulation where it has not;
//  - no reassociation (no -ffast-math): the compiler may vectorise a loop only where that keeps
//    each value's own order of operations, so the vector width of the CPU changes nothing;
//  - Eigen neither vectorises by hand (EIGEN_DONT_VECTORIZE: its packet reductions and products
//    sum in an order set by the packet width and the data's alignment) nor threads its products
//    (EIGEN_DONT_PARALLELIZE: its blocking depends on the thread count), and its cache blocking is
//    fixed (fix_eigen_blocking below), so a product's order does not depend on the CPU's caches;
//  - libm is not trusted to agree across CPUs: glibc picks an FMA or an SSE2 build of exp at run
//    time, and the two round some arguments differently. exp here is our own, in plain double
//    operations.
// The fast kernels below are plain loops in a fixed order of operations; the compiler vectorises
// them for the build's CPU (across independent outputs, never inside one sum).
#pragma once

#if defined(__FAST_MATH__)
#error "attnscope is compiled without -ffast-math: its results and margins assume IEEE arithmetic"
#endif

#include <Eigen/Core>

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace attnscope::portable {

/// e^x in double, within 1 ulp (Cody-Waite reduction by ln 2 and a rational approximation of
/// exp on [-ln2/2, ln2/2]): +inf above 709.78, 0 below -745.13, NaN for NaN. The same bits on
/// every CPU, unlike std::exp.
double exp(double x);

/// ln x in double, within 1 ulp (x = 2^k y with y in [sqrt(2)/2, sqrt(2)), then a rational
/// approximation of ln y): -inf at 0, NaN below 0 and for NaN, +inf at +inf. Subnormal x too.
double log(double x);

/// erf x in double, within 2 ulp (measured: tests/unit/test_replay_fast.cpp), the same bits on
/// every CPU, unlike std::erf (glibc picks an FMA or an SSE2 build at run time): |x| <= 1 as
/// x P(x^2), 1 < |x| <= 3 as a polynomial in |x| - 2 (Chebyshev fits, Horner's rule in fused
/// steps), 3 < |x| < 6 as 1 - exp(-x^2) Q(1/|x|) / |x| with portable::exp, +-1 beyond; NaN for
/// NaN. For the exact GELU of replay's MLP.
double erf(double x);

/// y[t] = erf(x[t]) for t < n, the same bits as erf: the polynomials of |x| <= 3 for every entry
/// in one vectorised pass, then the few entries beyond in a second. y must not overlap x.
void erfs(const double* x, double* y, Eigen::Index n);

/// Two independent standard normal numbers from two uniform numbers u, v in [-1, 1] (Marsaglia's
/// polar method, only + * / sqrt and log above): false when (u, v) falls outside the unit disc or
/// on its centre, and the caller draws again. The same numbers on every CPU.
bool polar_normal_pair(double u, double v, double& a, double& b);

/// e^x of a float, in float with fused steps: within 1 ulp (0.92 measured), the same bits on every
/// CPU, and vectorisable (no branch; fma an instruction where the build has FMA). Results below
/// the smallest normal float (x < -87.34) are 0, an absolute error under 2^-126; above 88.72, +inf.
float exp_float(float x);

/// exp or exp_float by type, for Eigen's unaryExpr.
struct Exp {
  double operator()(double x) const { return exp(x); }
  float operator()(float x) const { return exp_float(x); }
};

/// x[t] = exp_float(x[t] - shift) for t < n (the softmax step, vectorised).
void exp_floats(float* x, Eigen::Index n, float shift = 0.0F);

/// The largest of fl(x[t] * s) for t < n that is not NaN (-inf for n = 0 or where every product
/// is NaN), without writing the products. The largest value does not depend on the order it is
/// searched in: searched in vector lanes.
float max_scaled(const float* x, Eigen::Index n, float s);

/// x[t] = exp_float(x[t] * s - shift) for t < n (the product rounded to float first), and the sum
/// of the results in double in lane_sum's fixed order (lane_sum.hpp): the same bits on every CPU.
/// The softmax step of every float row (with shift = max_scaled(x, n, s)).
double exp_floats_sum(float* x, Eigen::Index n, float s, float shift);

/// exp_floats_sum of rows r < rows (row r at x + r ld, length n, shifted by shifts[r]) into
/// sums[r]: the same bits as one call per row, several rows' sums at once.
void exp_floats_sums(float* x, Eigen::Index ld, Eigen::Index rows, Eigen::Index n, float s, const float* shifts,
                     double* sums);

/// The softmax step of float rows: tops[r] = max_scaled(row r, n, s), then exp_floats_sums of the
/// rows with those shifts, the same bits, faster: no argument is then above 0, so the fallback
/// of exp_floats_sums for such arguments is never needed and its check is left out. logits (when
/// not null, row r at logits + r ld_logits) receives every argument fl(fl(x * s) - tops[r]).
/// Returns whether every top and every sum is finite: false where a row's products overflow,
/// or where one is NaN (the overflow of a dot product's partial sums), whose exponential is NaN.
bool softmax_exps(float* x, Eigen::Index ld, Eigen::Index rows, Eigen::Index n, float s, float* tops, double* sums,
                  float* logits = nullptr, Eigen::Index ld_logits = 0);

/// Sums of float rows widened to double, each in lane_sum's fixed order (lane_sum.hpp: kLanes
/// lanes, lane l summing the terms t = l mod kLanes in increasing t, then the tail summed in order
/// plus the lanes' fixed tree) and so the same bits as lane_sum of the same terms, on every CPU; in vector
/// registers, several rows at once where the rows are many (their final additions interleaved).
/// sum_widened: x[t]; sum_of_squares: x[t]^2; distance2: (x[t] - y[t])^2; the dots: x[t] y[t]
/// (differences and products each rounded once in double, added without contraction).
double sum_widened(const float* x, Eigen::Index n);
double sum_of_squares(const float* x, Eigen::Index n);
double distance2(const float* x, const float* y, Eigen::Index n);
/// out[r] = sum_of_squares of row r, r < rows, rows of length n at x + r ld.
void sums_of_squares(const float* x, Eigen::Index ld, Eigen::Index rows, Eigen::Index n, double* out);
/// out[r] = distance2 of row r (at x + r ld) and y, r < rows.
void distances2(const float* x, Eigen::Index ld, Eigen::Index rows, const float* y, Eigen::Index n, double* out);
/// out[r] = the sum over t < n of (x_r[t] - y[t])^2 in float (row r at x + r ld), in lane_sum's
/// order with float lanes: the same bits on every CPU. Any order of a float sum of squares of
/// rounded differences is within gamma_(n+2) = (n + 2) u / (1 - (n + 2) u) (u = 2^-24) of the exact
/// sum relative to it, plus n 2^-149 absolute for squares that underflow.
void distances2_float(const float* x, Eigen::Index ld, Eigen::Index rows, const float* y, Eigen::Index n,
                      float* out);
/// out[r] = the sum over t < n of x_r[t]^2 in float by fused steps (row r at x + r ld), lane_sum's
/// order with float lanes: the same bits on every CPU. Within gamma_n relative of the exact sum,
/// plus n 2^-149 for steps that round in the subnormal range; +inf when it overflows.
void sums_of_squares_float(const float* x, Eigen::Index ld, Eigen::Index rows, Eigen::Index n, float* out);
/// The sum of x[t] y[t] (the product of the two in double), for a double y.
double dot_widened(const float* x, const double* y, Eigen::Index n);
/// out[r] = the sum of x_r[t] y_r[t] (both widened, their product in double), row r of x at
/// x + r ld and of y at y + r y_ld, r < rows.
void dots_widened(const float* x, Eigen::Index ld, const float* y, Eigen::Index y_ld, Eigen::Index rows,
                  Eigen::Index n, double* out);

/// x[t] = exp(x[t] - shift) for t < n: the same bits as portable::exp of each (its branches made
/// selects, so that the loop vectorises; tests/unit/test_replay_fast.cpp compares them bit for bit
/// on every range, edges, subnormal results, infinities and NaN included).
void exp_doubles(double* x, Eigen::Index n, double shift = 0.0);

/// Whether every x[t], t < n, is finite (a vectorised test; true for n = 0).
bool all_finite(const double* x, Eigen::Index n);

/// The largest of x[0..n) (-inf for n = 0; NaNs skipped): the same value in any order of search,
/// so searched in vector lanes.
double max_of(const double* x, Eigen::Index n);


/// C (m x n, row stride ldc) = A B^T: A is m x k (row stride lda), B is n x k (row stride ldb),
/// all row-major. Every c_ij = fma(a_i,k-1, b_j,k-1, ... fma(a_i1, b_j1, fma(a_i0, b_j0, 0))), in
/// that order: the result does not depend on the CPU, the build or the blocking.
template <typename T>
void gemm_nt(const T* a, Eigen::Index lda, const T* b, Eigen::Index ldb, T* c, Eigen::Index ldc, Eigen::Index m,
             Eigen::Index n, Eigen::Index k);

/// C (m x n) = A B with A m x k (element (i, t) at a[i * a_row + t * a_col]) and B k x n
/// row-major (row stride ldb): the same order of operations as gemm_nt.
template <typename T>
void gemm_nn(const T* a, Eigen::Index a_row, Eigen::Index a_col, const T* b, Eigen::Index ldb, T* c,
             Eigen::Index ldc, Eigen::Index m, Eigen::Index n, Eigen::Index k);

/// c = a b for Eigen matrices and views: a with any strides (a transpose too), b and c row-major
/// with unit inner stride (checked), c already of a.rows() x b.cols(). gemm_nn's order.
template <typename A, typename B, typename C>
void product(const A& a, const B& b, C&& c) {
  using T = typename A::Scalar;
  if (b.colStride() != 1 || c.colStride() != 1 || a.cols() != b.rows() || c.rows() != a.rows() ||
      c.cols() != b.cols()) {
    throw std::logic_error("portable::product: shapes or layouts disagree");
  }
  gemm_nn<T>(a.data(), a.rowStride(), a.colStride(), b.data(), b.rowStride(), c.data(), c.rowStride(), a.rows(),
             b.cols(), a.cols());
}

/// c = a b^T, a, b and c row-major with unit inner stride (checked): gemm_nt's order.
template <typename A, typename B, typename C>
void product_nt(const A& a, const B& b, C&& c) {
  using T = typename A::Scalar;
  if (a.colStride() != 1 || b.colStride() != 1 || c.colStride() != 1 || a.cols() != b.cols() ||
      c.rows() != a.rows() || c.cols() != b.rows()) {
    throw std::logic_error("portable::product_nt: shapes or layouts disagree");
  }
  gemm_nt<T>(a.data(), a.rowStride(), b.data(), b.rowStride(), c.data(), c.rowStride(), a.rows(), b.rows(),
             a.cols());
}

/// out (cols x rows, row stride ldo) = in^T, in rows x cols (row stride ldi): out[c ldo + r] =
/// in[r ldi + c], widened to double in the second form (exact). Moves values only (NaN payloads,
/// signed zeros and subnormals included), in 8 x 8 register blocks where the build has AVX2.
/// out must not overlap in.
void transpose(const float* in, Eigen::Index ldi, Eigen::Index rows, Eigen::Index cols, float* out,
               Eigen::Index ldo);
void transpose(const float* in, Eigen::Index ldi, Eigen::Index rows, Eigen::Index cols, double* out,
               Eigen::Index ldo);

/// B (k x n) packed once for many products C = A B (a dense layer's weights, reused for every
/// image): column panels of the product kernel's width (which depends on the build's vector
/// width), each k x width and contiguous, zero columns past n. Packing moves values only, so
/// gemm_packed's results do not depend on the layout.
template <typename T>
class PackedMatrix {
 public:
  PackedMatrix() = default;
  /// B's element (t, j) at b[t * b_row + j * b_col], t < k, j < n: B itself (b_row = ldb,
  /// b_col = 1) or a transpose (b_row = 1, b_col = ld of the matrix transposed). Reuses the storage.
  void pack(const T* b, Eigen::Index b_row, Eigen::Index b_col, Eigen::Index k, Eigen::Index n);
  [[nodiscard]] Eigen::Index rows() const { return k_; }
  [[nodiscard]] Eigen::Index cols() const { return n_; }
  [[nodiscard]] const T* data() const { return data_.data(); }
  /// Columns per panel (the kernel's width for T on this build).
  [[nodiscard]] static Eigen::Index panel_width();

 private:
  std::vector<T, Eigen::aligned_allocator<T>> data_;
  Eigen::Index k_ = 0, n_ = 0;
};

/// C (m x b.cols(), row stride ldc) = A B, A m x b.rows() row-major (row stride lda): every
/// c_ij = fma(a_i,k-1, b_k-1,j, ... fma(a_i0, b_0j, 0)), in that order, as gemm_nt and gemm_nn:
/// the result does not depend on the CPU, the build, the blocking or the packing. Faster than
/// gemm_nn for repeated B (no packing per call) and larger register tiles on AVX-512.
template <typename T>
void gemm_packed(const T* a, Eigen::Index lda, const PackedMatrix<T>& b, T* c, Eigen::Index ldc, Eigen::Index m);

/// A dense layer's output in double: C (m x b.cols(), row stride ldc) = double(A B) + bias, or with
/// `accumulate` C + (double(A B) + bias), A B in float exactly as gemm_packed<float> computes it:
/// the products never leave the registers as a float matrix.
void gemm_packed_widen(const float* a, Eigen::Index lda, const PackedMatrix<float>& b, const double* bias, double* c,
                       Eigen::Index ldc, Eigen::Index m, bool accumulate);

/// Eigen's matrix products block their inner dimension by sizes computed from the CPU's cache
/// sizes, which changes the order of a long sum from one CPU to another. This sets fixed sizes
/// (once per process; every program of the project calls it before its first product through
/// the static initialiser in fixed_blocking.cpp).
void fix_eigen_blocking();

/// The sources whose margins or results assume the model above each define one of these as the
/// plain expression a * b + c, compiled with that source's own flags. Tests call them with
/// arguments whose fused and unfused results differ: a build that contracts there fails them.
namespace probe {
double portable_math(double a, double b, double c);
double confusion_softmax(double a, double b, double c);
double confusion_lowrank(double a, double b, double c);
double candidate_margin(double a, double b, double c);
}  // namespace probe

}  // namespace attnscope::portable
