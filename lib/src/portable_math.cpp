// portable_math.hpp: exp and matrix products in a fixed order of plain IEEE operations.
#include "attnscope/portable_math.hpp"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

namespace attnscope::portable {

namespace {

constexpr double kInvLn2 = 1.4426950408889634;      // 1 / ln 2, rounded
constexpr double kLn2Hi = 6.93147180369123816490e-01;  // ln 2 to 32 bits: n * kLn2Hi is exact for |n| < 2^21
constexpr double kLn2Lo = 1.90821492927058770002e-10;  // ln 2 - kLn2Hi
constexpr double kShift = 6755399441055744.0;          // 1.5 * 2^52: x + kShift rounds x to an integer
// The minimax coefficients of R(r^2) with exp(r) = 1 + 2r / (R - r), |r| <= ln2 / 2
// (a rational form whose error stays below 2^-59 on the interval: published constants).
constexpr double kP1 = 1.66666666666666019037e-01;
constexpr double kP2 = -2.77777777770155933842e-03;
constexpr double kP3 = 6.61375632143793436117e-05;
constexpr double kP4 = -1.65339022054652515390e-06;
constexpr double kP5 = 4.13813679705723846039e-08;
constexpr double kOverflow = 7.09782712893383973096e+02;    // ln(largest double)
constexpr double kUnderflow = -7.45133219101941108420e+02;  // ln(2^-1075): below, exp rounds to 0

// ln(1 + f) = f - f^2/2 + s (f^2/2 + R(s^2)), s = f / (2 + f): the minimax coefficients of R
// (published constants; the approximation errs by < 2^-58.45 on |s| <= 0.1716).
constexpr double kLg1 = 6.666666666666735130e-01;
constexpr double kLg2 = 3.999999999940941908e-01;
constexpr double kLg3 = 2.857142874366239149e-01;
constexpr double kLg4 = 2.222219843214978396e-01;
constexpr double kLg5 = 1.818357216161805012e-01;
constexpr double kLg6 = 1.531383769920937332e-01;
constexpr double kLg7 = 1.479819860511658591e-01;

/// 2^e as a double for -1022 <= e <= 1023.
double pow2(std::int64_t e) { return std::bit_cast<double>(static_cast<std::uint64_t>(e + 1023) << 52); }

/// Eigen's products (through the fixed cache sizes) and our own ones run in this program: set the
/// blocking before main.
[[maybe_unused]] const bool kBlockingFixed = (fix_eigen_blocking(), true);

}  // namespace

double exp(double x) {
  if (std::isnan(x)) return x;
  if (x > kOverflow) return std::numeric_limits<double>::infinity();
  if (x < kUnderflow) return 0.0;
  // x = n ln2 + r, |r| <= ln2 / 2 (plus a rounding): hi - lo is r, hi exact.
  const double n = (x * kInvLn2 + kShift) - kShift;
  const double hi = x - n * kLn2Hi;
  const double lo = n * kLn2Lo;
  const double r = hi - lo;
  const double r2 = r * r;
  const double c = r - r2 * (kP1 + r2 * (kP2 + r2 * (kP3 + r2 * (kP4 + r2 * kP5))));
  const double y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi);  // exp(r), within 1 ulp
  const auto e = static_cast<std::int64_t>(n);
  if (e >= -1021) return e <= 1023 ? y * pow2(e) : (y * 2.0) * pow2(e - 1);
  return (y * pow2(e + 1000)) * pow2(-1000);  // subnormal result: one more rounding
}

double log(double x) {
  if (std::isnan(x) || x < 0.0) return std::numeric_limits<double>::quiet_NaN();
  if (x == 0.0) return -std::numeric_limits<double>::infinity();
  if (std::isinf(x)) return x;
  std::int64_t k = 0;
  if (x < std::numeric_limits<double>::min()) {  // subnormal: scale into the normal range
    x *= 0x1p54;
    k = -54;
  }
  const auto bits = std::bit_cast<std::uint64_t>(x);
  k += static_cast<std::int64_t>(bits >> 52) - 1023;
  double y = std::bit_cast<double>((bits & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL);  // [1, 2)
  if (y > 1.4142135623730951) {
    y *= 0.5;
    ++k;
  }
  const double f = y - 1.0;
  const double s = f / (2.0 + f);
  const double z = s * s;
  const double w = z * z;
  const double r = z * (kLg1 + w * (kLg3 + w * (kLg5 + w * kLg7))) + w * (kLg2 + w * (kLg4 + w * kLg6));
  const double hfsq = 0.5 * f * f;
  const auto dk = static_cast<double>(k);
  return dk * kLn2Hi - ((hfsq - (s * (hfsq + r) + dk * kLn2Lo)) - f);
}

bool polar_normal_pair(double u, double v, double& a, double& b) {
  const double s = u * u + v * v;
  if (!(s < 1.0) || s == 0.0) return false;
  const double factor = std::sqrt(-2.0 * log(s) / s);
  a = u * factor;
  b = v * factor;
  return true;
}

namespace {

/// 2^e as a float for -126 <= e <= 127.
inline float pow2f(std::int32_t e) { return std::bit_cast<float>(static_cast<std::uint32_t>(e + 127) << 23); }

/// exp_float's body, inlined into the loops so that they vectorise. All in float: x = n ln2 + r
/// (Cody-Waite, the fused steps exact), e^r by its degree-7 Taylor polynomial in Horner form with
/// fused steps (truncation < 2^-27 relative on |r| <= ln2 / 2), then 2^n in two exact halves.
/// Measured within 0.92 ulp (tests/unit/test_portable_math.cpp).
inline float exp_float_inline(float x0) {
  constexpr float kLo = -87.336544F;  // ln(2^-126): below, the result would be subnormal: 0
  constexpr float kHi = 88.7228394F;  // ln(largest float): above, +inf
  constexpr float kShiftF = 12582912.0F;  // 1.5 * 2^23
  float x = x0 < kLo ? kLo : x0;  // ternaries, not std::clamp: they vectorise as selects
  x = x > kHi ? kHi : x;
  const float t = std::fma(x, 1.44269504F, kShiftF);
  const float n = t - kShiftF;
  float r = std::fma(n, -0.693145752F, x);  // ln 2 to 16 bits: n * it is exact
  r = std::fma(n, -1.42860677e-06F, r);     // the rest of ln 2
  float p = 1.0F / 5040.0F;
  p = std::fma(p, r, 1.0F / 720.0F);
  p = std::fma(p, r, 1.0F / 120.0F);
  p = std::fma(p, r, 1.0F / 24.0F);
  p = std::fma(p, r, 1.0F / 6.0F);
  p = std::fma(p, r, 0.5F);
  p = std::fma(p, r, 1.0F);
  p = std::fma(p, r, 1.0F);
  // n sits in the low bits of t: 2^n from integer operations alone. -126 <= n <= 128, so the two
  // halves are normal floats and the first product is exact.
  const auto e = static_cast<std::int32_t>(std::bit_cast<std::uint32_t>(t) - std::bit_cast<std::uint32_t>(kShiftF));
  const std::int32_t e1 = e / 2, e2 = e - e1;
  const float y = (p * pow2f(e1)) * pow2f(e2);
  return x0 < kLo ? 0.0F : (x0 > kHi ? HUGE_VALF : y);
}

}  // namespace

float exp_float(float x) { return exp_float_inline(x); }

void exp_floats(float* x, Eigen::Index n, float shift) {
  for (Eigen::Index t = 0; t < n; ++t) x[t] = exp_float_inline(x[t] - shift);
}

namespace {

/// One vector register of the build's CPU, and the fused multiply-add on it: the same operation,
/// lane by lane, as std::fma on each element (exact product, one rounding). Where the build has
/// neither AVX-512 nor AVX2 + FMA, one element at a time through std::fma (glibc's exact
/// emulation where the CPU lacks FMA): slower, and the same bits.
template <typename T>
struct Simd;
#if defined(__AVX512F__)
template <>
struct Simd<float> {
  using V = __m512;
  static constexpr Eigen::Index W = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
};
template <>
struct Simd<double> {
  using V = __m512d;
  static constexpr Eigen::Index W = 8;
  static V zero() { return _mm512_setzero_pd(); }
  static V load(const double* p) { return _mm512_loadu_pd(p); }
  static void store(double* p, V v) { _mm512_storeu_pd(p, v); }
  static V set1(double x) { return _mm512_set1_pd(x); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_pd(a, b, c); }
  static V max(V a, V b) { return _mm512_max_pd(a, b); }
};
#elif defined(__AVX2__) && defined(__FMA__)
template <>
struct Simd<float> {
  using V = __m256;
  static constexpr Eigen::Index W = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
};
template <>
struct Simd<double> {
  using V = __m256d;
  static constexpr Eigen::Index W = 4;
  static V zero() { return _mm256_setzero_pd(); }
  static V load(const double* p) { return _mm256_loadu_pd(p); }
  static void store(double* p, V v) { _mm256_storeu_pd(p, v); }
  static V set1(double x) { return _mm256_set1_pd(x); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
  static V max(V a, V b) { return _mm256_max_pd(a, b); }
};
#else
template <typename T>
struct Simd {
  using V = T;
  static constexpr Eigen::Index W = 1;
  static V zero() { return T(0); }
  static V load(const T* p) { return *p; }
  static void store(T* p, V v) { *p = v; }
  static V set1(T x) { return x; }
  static V fma(V a, V b, V c) { return std::fma(a, b, c); }
  static V max(V a, V b) { return a > b ? a : b; }
};
#endif

/// Rows of A per block, and columns of C per block (two registers): the accumulators stay in
/// registers. Neither changes any value: every c_ij is summed over t in increasing order.
constexpr Eigen::Index kRows = 6;
template <typename T>
constexpr Eigen::Index kCols = 2 * Simd<T>::W;

/// C rows [i0, i0 + R) x columns [j0, j0 + J) = A P over t < k: A's R rows packed t-major (ap,
/// R entries per t), P k x J' row-major (ldp), the first `cols` of the J columns written. Each step
/// is one fused multiply-add per element.
template <typename T, Eigen::Index R>
void block(const T* ap, const T* p, Eigen::Index ldp, T* c, Eigen::Index ldc, Eigen::Index k, Eigen::Index cols) {
  using S = Simd<T>;
  constexpr Eigen::Index W = S::W;
  typename S::V acc[R][2];
  for (Eigen::Index r = 0; r < R; ++r) acc[r][0] = acc[r][1] = S::zero();
  for (Eigen::Index t = 0; t < k; ++t) {
    const typename S::V b0 = S::load(p + t * ldp), b1 = S::load(p + t * ldp + W);
    for (Eigen::Index r = 0; r < R; ++r) {
      const typename S::V a = S::set1(ap[t * R + r]);
      acc[r][0] = S::fma(a, b0, acc[r][0]);
      acc[r][1] = S::fma(a, b1, acc[r][1]);
    }
  }
  if (cols == 2 * W) {
    for (Eigen::Index r = 0; r < R; ++r) {
      S::store(c + r * ldc, acc[r][0]);
      S::store(c + r * ldc + W, acc[r][1]);
    }
    return;
  }
  T tile[2 * W];
  for (Eigen::Index r = 0; r < R; ++r) {
    S::store(tile, acc[r][0]);
    S::store(tile + W, acc[r][1]);
    std::copy(tile, tile + cols, c + r * ldc);
  }
}

/// Per-thread packing buffers (0: B or P, 1: A's panel), grown to the largest call and reused.
template <typename T>
std::vector<T>& packing_buffer(int which) {
  thread_local std::vector<T> buffer[2];
  return buffer[which];
}

/// Rows [i, i + R) of A (element (i, t) at a[i * a_row + t * a_col]) packed t-major into ap.
template <typename T, Eigen::Index R>
void pack_rows(const T* a, Eigen::Index a_row, Eigen::Index a_col, Eigen::Index k, T* ap) {
  for (Eigen::Index t = 0; t < k; ++t)
    for (Eigen::Index r = 0; r < R; ++r) ap[t * R + r] = a[r * a_row + t * a_col];
}

/// C = A P with P packed k x n_pad (n_pad a multiple of J, zero columns past n): every column
/// block is a whole block, the last one written only up to n. Padding adds zero products to
/// columns that are never written, so it changes no value; packing moves values, nothing else.
template <typename T>
void product(const T* a, Eigen::Index a_row, Eigen::Index a_col, const T* p, Eigen::Index ldp, T* c,
             Eigen::Index ldc, Eigen::Index m, Eigen::Index n, Eigen::Index k) {
  constexpr Eigen::Index J = kCols<T>;
  const Eigen::Index m_full = m - m % kRows;
  std::vector<T>& ap = packing_buffer<T>(1);
  ap.resize(static_cast<std::size_t>(std::max<Eigen::Index>(k * kRows, 1)));
  for (Eigen::Index i = 0; i < m; i += kRows) {
    const bool whole = i < m_full;
    if (whole) {
      pack_rows<T, kRows>(a + i * a_row, a_row, a_col, k, ap.data());
    }
    for (Eigen::Index r = 0; !whole && i + r < m; ++r) {
      pack_rows<T, 1>(a + (i + r) * a_row, a_row, a_col, k, ap.data() + r * k);
    }
    for (Eigen::Index j = 0; j < n; j += J) {
      const Eigen::Index cols = std::min(J, n - j);
      if (whole) {
        block<T, kRows>(ap.data(), p + j, ldp, c + i * ldc + j, ldc, k, cols);
      } else {
        for (Eigen::Index r = 0; i + r < m; ++r) {
          block<T, 1>(ap.data() + r * k, p + j, ldp, c + (i + r) * ldc + j, ldc, k, cols);
        }
      }
    }
  }
}

template <typename T>
Eigen::Index padded(Eigen::Index n) {
  return (n + kCols<T> - 1) / kCols<T> * kCols<T>;
}

}  // namespace

template <typename T>
void gemm_nt(const T* a, Eigen::Index lda, const T* b, Eigen::Index ldb, T* c, Eigen::Index ldc, Eigen::Index m,
             Eigen::Index n, Eigen::Index k) {
  // B^T packed k x n_pad: the inner loops then read contiguous, whole column blocks.
  const Eigen::Index ld = padded<T>(n);
  std::vector<T>& p = packing_buffer<T>(0);
  p.assign(static_cast<std::size_t>(std::max<Eigen::Index>(k * ld, 1)), T(0));
  for (Eigen::Index j = 0; j < n; ++j)
    for (Eigen::Index t = 0; t < k; ++t) p[static_cast<std::size_t>(t * ld + j)] = b[j * ldb + t];
  product(a, lda, Eigen::Index{1}, p.data(), ld, c, ldc, m, n, k);
}

template <typename T>
void gemm_nn(const T* a, Eigen::Index a_row, Eigen::Index a_col, const T* b, Eigen::Index ldb, T* c,
             Eigen::Index ldc, Eigen::Index m, Eigen::Index n, Eigen::Index k) {
  const Eigen::Index ld = padded<T>(n);
  std::vector<T>& p = packing_buffer<T>(0);
  p.assign(static_cast<std::size_t>(std::max<Eigen::Index>(k * ld, 1)), T(0));
  for (Eigen::Index t = 0; t < k; ++t) std::copy(b + t * ldb, b + t * ldb + n, p.begin() + t * ld);
  product(a, a_row, a_col, p.data(), ld, c, ldc, m, n, k);
}

template void gemm_nt<float>(const float*, Eigen::Index, const float*, Eigen::Index, float*, Eigen::Index,
                             Eigen::Index, Eigen::Index, Eigen::Index);
template void gemm_nt<double>(const double*, Eigen::Index, const double*, Eigen::Index, double*, Eigen::Index,
                              Eigen::Index, Eigen::Index, Eigen::Index);
template void gemm_nn<float>(const float*, Eigen::Index, Eigen::Index, const float*, Eigen::Index, float*,
                             Eigen::Index, Eigen::Index, Eigen::Index, Eigen::Index);
template void gemm_nn<double>(const double*, Eigen::Index, Eigen::Index, const double*, Eigen::Index, double*,
                              Eigen::Index, Eigen::Index, Eigen::Index, Eigen::Index);

float scale_and_max(float* x, Eigen::Index n, float s) {
  using S = Simd<float>;
  for (Eigen::Index t = 0; t < n; ++t) x[t] *= s;
  // The largest value is the same in any order (the sign of a zero aside, which no use of it
  // sees: x - top and exp then give the same values).
  S::V m = S::set1(-HUGE_VALF);
  Eigen::Index t = 0;
  for (; t + S::W <= n; t += S::W) m = S::max(m, S::load(x + t));
  float lane[S::W];
  S::store(lane, m);
  float top = -HUGE_VALF;
  for (const float l : lane) top = l > top ? l : top;
  for (; t < n; ++t) top = x[t] > top ? x[t] : top;
  return top;
}

double probe::portable_math(double a, double b, double c) { return a * b + c; }

void fix_eigen_blocking() {
  // Sizes of a common x86-64 core; what matters is that they never change.
  Eigen::setCpuCacheSizes(32 * 1024, 1024 * 1024, 8 * 1024 * 1024);
}

}  // namespace attnscope::portable
