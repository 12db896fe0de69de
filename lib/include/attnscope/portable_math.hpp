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

namespace attnscope::portable {

/// e^x in double, within 1 ulp (Cody-Waite reduction by ln 2 and a rational approximation of
/// exp on [-ln2/2, ln2/2]): +inf above 709.78, 0 below -745.13, NaN for NaN. The same bits on
/// every CPU, unlike std::exp.
double exp(double x);

/// ln x in double, within 1 ulp (x = 2^k y with y in [sqrt(2)/2, sqrt(2)), then a rational
/// approximation of ln y): -inf at 0, NaN below 0 and for NaN, +inf at +inf. Subnormal x too.
double log(double x);

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

/// x[t] *= s for t < n, and the largest of the products (-inf for n = 0). The largest value does
/// not depend on the order it is searched in; 16 lanes let the compiler vectorise the search.
float scale_and_max(float* x, Eigen::Index n, float s);

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
