// portable_math.hpp: exp and matrix products in a fixed order of plain IEEE operations.
#include "attnscope/portable_math.hpp"

#include "attnscope/lane_sum.hpp"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

namespace attnscope::portable {

// The elementwise loops below (exp_doubles, erfs) vectorise across independent entries, each
// entry's operations in their own fixed order: the vector width changes the speed, never a value.
// GCC's tuning for recent Intel cores prefers 256-bit vectors; on AVX-512 these loops are
// division- and fma-bound, so they ask for 512-bit ones.
#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
#define ATTNSCOPE_WIDE_VECTORS __attribute__((target("prefer-vector-width=512")))
#else
#define ATTNSCOPE_WIDE_VECTORS
#endif

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

namespace {

/// exp's body with its branches as selects, for loops that vectorise: every operation of exp's
/// path, in its order, so that each result is exp's to the bit. n comes from the bits of
/// x / ln2 + 1.5 * 2^52 (the integer n sits in its low bits, as exp_float takes it), and the
/// three scalings of exp (normal, 2^1024 split in two, subnormal in two steps) become one form
/// (y * 2^ea) * 2^eb, a product by 2^0 being exact.
inline double exp_inline(double x0) {
  double x = x0 < kUnderflow ? kUnderflow : x0;  // ternaries, not std::clamp: they vectorise
  x = x > kOverflow ? kOverflow : x;
  const double t = x * kInvLn2 + kShift;
  const double n = t - kShift;
  const double hi = x - n * kLn2Hi;
  const double lo = n * kLn2Lo;
  const double r = hi - lo;
  const double r2 = r * r;
  const double c = r - r2 * (kP1 + r2 * (kP2 + r2 * (kP3 + r2 * (kP4 + r2 * kP5))));
  const double y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi);
  const auto e = static_cast<std::int64_t>(std::bit_cast<std::uint64_t>(t) - std::bit_cast<std::uint64_t>(kShift));
  const bool low = e < -1021, high = e > 1023;
  const std::int64_t ea = low ? e + 1000 : (high ? 1 : e);
  const std::int64_t eb = low ? -1000 : (high ? e - 1 : 0);
  const double scaled = (y * pow2(ea)) * pow2(eb);
  const double out = x0 < kUnderflow ? 0.0 : (x0 > kOverflow ? std::numeric_limits<double>::infinity() : scaled);
  return x0 != x0 ? x0 : out;
}

}  // namespace

ATTNSCOPE_WIDE_VECTORS void exp_doubles(double* x, Eigen::Index n, double shift) {
  for (Eigen::Index t = 0; t < n; ++t) x[t] = exp_inline(x[t] - shift);
}

namespace {

// The coefficients of erf's three pieces (written by mpmath's chebyfit at 60 digits, then rounded
// to double; the fit errors below are those of the exact coefficients).
// kErfSmall: Chebyshev fit on [0.0, 1.0], 13 coefficients, highest degree first; fit error 1.3e-19
constexpr double kErfSmall[13] = {
    0x1.05ffd737fb32ep-34,  // 5.9571761477489114044e-11
    -0x1.389d4f2641625p-30,  // -1.137284885679167367e-9
    0x1.f7b4bf3b13964p-27,  // 1.4659775274047435814e-8
    -0x1.5f1ecb6f0764cp-23,  // -1.6350312701054695011e-7
    0x1.b9df224ca4b97p-20,  // 1.6461000484121368033e-6
    -0x1.f4d1e3183f7aep-17,  // -0.000014925595266831181565
    0x1.f9a321d5b8e1ep-14,  // 0.00012055331111642710923
    -0x1.c02db3dac435fp-11,  // -0.00085483269808337899052
    0x1.565bcd0dbaa38p-8,  // 0.0052239776248180144673
    -0x1.b82ce31284e00p-6,  // -0.026866170645076793248
    0x1.ce2f21a042b30p-4,  // 0.11283791670954878666
    -0x1.812746b0379e6p-2,  // -0.37612638903183748056
    0x1.20dd750429b6dp+0,  // 1.1283791670955125738
};
// kErfMid: Chebyshev fit on [-1.0, 1.0], 26 coefficients, highest degree first; fit error 6.91e-20
constexpr double kErfMid[26] = {
    0x1.52637fe5147e1p-38,  // 4.808792230483701712e-12
    0x1.662ed12a36b72p-36,  // 2.036033942562474774e-11
    -0x1.2c4299a101034p-33,  // -1.3654251083212790539e-10
    -0x1.50c1d65808c5bp-33,  // -1.531394340773252097e-10
    0x1.1a9a8eb57bc5bp-29,  // 2.0562128343248737657e-9
    -0x1.1b9d80df7097ep-29,  // -2.0635725209507725128e-9
    -0x1.3e696e5d8519ap-26,  // -1.8534008430492750763e-8
    0x1.0268489d719d5p-24,  // 6.0165151492039357465e-8
    0x1.fc687890e3a7ap-25,  // 5.9186491380767122177e-8
    -0x1.7802483e583fdp-21,  // -7.0037118131080193852e-7
    0x1.00fea9f7053abp-20,  // 9.5738016426159564006e-7
    0x1.0928acb4c23fdp-18,  // 3.9511752916243965604e-6
    -0x1.108280fc48391p-16,  // -0.000016242848674189222223
    0x1.5efa38605ee81p-18,  // 5.2299711515952730918e-6
    0x1.b3399157db497p-14,  // 0.00010376569605137702373
    -0x1.13917bb1c7eecp-12,  // -0.000262802404096247903
    -0x1.a46c56b1795b3p-15,  // -0.000050118350724475021567
    0x1.a1143440ea309p-10,  // 0.0015910298245477868949
    -0x1.bae0ab9d915c2p-9,  // -0.0033788880817009213761
    0x1.e1935ea6df4b0p-12,  // 0.0004592663412309001429
    0x1.ace7404c2b22ap-7,  // 0.013089090724258307539
    -0x1.1a2c59757abd6p-5,  // -0.034444975590154732156
    0x1.8b0ae3a478923p-5,  // 0.048222965826214792216
    -0x1.529b9e8cf9a1bp-5,  // -0.041333970708184084362
    0x1.529b9e8cf9a1ep-6,  // 0.020666985354092053857
    0x1.fd9ae142795e3p-1,  // 0.99532226501895273409
};
// kErfcTail: Chebyshev fit on [0.166667, 0.333333], 12 coefficients, highest degree first; fit error 4.17e-16
constexpr double kErfcTail[12] = {
    -0x1.0e6461e299653p+1,  // -2.1124384266320617559
    0x1.3bbdfb9f8891dp+2,  // 4.9334706361717307149
    -0x1.cbc3440685464p+1,  // -3.591896537002456797
    -0x1.0e87baf1fc492p+0,  // -1.0567585793290031969
    0x1.c8fbf4104c114p+1,  // 3.5701890067649715797
    -0x1.2ef82e5009569p+1,  // -2.3669488802722083273
    0x1.3be9bf9a01cf6p-2,  // 0.30850886704907000481
    0x1.7e58bc3c8bab0p-2,  // 0.37338537330189591918
    0x1.68ef51f340ef8p-8,  // 0.0055074286531213640688
    -0x1.2146f1cc1dbe0p-2,  // -0.28249719436956686821
    0x1.26653a8e152b7p-16,  // 0.000017547334714445718556
    0x1.20dd696205d25p-1,  // 0.5641892368466058482
};

/// p(x) by Horner's rule in fused steps, highest degree first.
template <int N>
inline double horner(const double (&c)[N], double x) {
  double p = c[0];
#pragma GCC unroll 32
  for (int i = 1; i < N; ++i) p = std::fma(p, x, c[i]);  // unrolled: the calling loop vectorises
  return p;
}

/// erf for |x| <= 1: x P(x^2) (P > 0: the sign is x's). Any other x gives a finite value or NaN
/// that is replaced.
inline double erf_small(double x0) {
  const double a = std::fabs(x0) <= 1.0 ? x0 : 1.0;
  return a * horner(kErfSmall, a * a);
}

/// erf for 1 < |x| <= 3: the polynomial about 2, with x's sign. Any other x: a finite value.
inline double erf_mid(double x0) {
  const double a0 = std::fabs(x0);
  const double a = a0 > 3.0 ? 3.0 : (a0 > 1.0 ? a0 : 1.0);
  return std::copysign(horner(kErfMid, a - 2.0), x0);
}

/// erf for |x| <= 3, branch-free (selects): the two pieces, for one value (erf() itself).
inline double erf_body(double x0) {
  return std::fabs(x0) <= 1.0 ? erf_small(x0) : erf_mid(x0);
}

/// erf for |x| > 3 and NaN: 1 - erfc, erfc = exp(-x^2) Q(1/|x|) / |x| (Q fits erfc(x) e^(x^2) x).
double erf_tail(double x) {
  if (std::isnan(x)) return x;
  const double a = std::fabs(x);
  if (a >= 6.0) return std::copysign(1.0, x);  // erfc(6) = 2.2e-17: 1 - erfc rounds to 1
  const double u = 1.0 / a;
  const double erfc = (exp(-(a * a)) * horner(kErfcTail, u)) * u;
  return std::copysign(1.0 - erfc, x);
}

inline bool erf_needs_tail(double x) { return !(std::fabs(x) <= 3.0); }

}  // namespace

double erf(double x) { return erf_needs_tail(x) ? erf_tail(x) : erf_body(x); }

ATTNSCOPE_WIDE_VECTORS void erfs(const double* x, double* y, Eigen::Index n) {
  // The small piece for every entry (vectorised), then the others gathered (most GELU inputs
  // are within 1: the mid piece's longer polynomial runs on those beyond only), each entry's
  // value that of erf().
  constexpr Eigen::Index kChunk = 256;
  alignas(64) std::int64_t idx[kChunk];
  alignas(64) double gathered[kChunk];
  for (Eigen::Index c0 = 0; c0 < n; c0 += kChunk) {
    const Eigen::Index len = std::min(kChunk, n - c0);
    const double* xc = x + c0;
    double* yc = y + c0;
    for (Eigen::Index t = 0; t < len; ++t) yc[t] = erf_small(xc[t]);
    Eigen::Index count = 0, t = 0;
#if defined(__AVX512F__)
    // The indices beyond 1 (or NaN), eight at a time: which indices, not any value, depends on it.
    const __m512i step = _mm512_set1_epi64(8);
    __m512i lanes = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
    const __m512d one = _mm512_set1_pd(1.0);
    for (; t + 8 <= len; t += 8, lanes = _mm512_add_epi64(lanes, step)) {
      const __m512d a = _mm512_abs_pd(_mm512_loadu_pd(xc + t));
      const __mmask8 beyond = _mm512_cmp_pd_mask(a, one, _CMP_NLE_UQ);
      _mm512_mask_compressstoreu_epi64(idx + count, beyond, lanes);
      count += __builtin_popcount(static_cast<unsigned>(beyond));
    }
#endif
    for (; t < len; ++t) {  // branch-free gathering of the indices beyond 1
      idx[count] = t;
      count += std::fabs(xc[t]) <= 1.0 ? 0 : 1;
    }
    for (Eigen::Index i = 0; i < count; ++i) gathered[i] = xc[idx[i]];
    for (Eigen::Index i = 0; i < count; ++i) gathered[i] = erf_mid(gathered[i]);
    for (Eigen::Index i = 0; i < count; ++i) {
      const double v = xc[idx[i]];
      yc[idx[i]] = erf_needs_tail(v) ? erf_tail(v) : gathered[i];
    }
  }
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

/// The reduction and polynomial of exp_float, inlined into the loops so that they vectorise. All
/// in float: x = n ln2 + r (Cody-Waite, the fused steps exact), e^r by its degree-7 Taylor
/// polynomial p in Horner form with fused steps (truncation < 2^-27 relative on |r| <= ln2 / 2);
/// n from the bits of t (integer operations alone).
struct ExpFloatParts {
  float p;
  std::int32_t n;
};
/// exp_float's constants, one set for its scalar form and its AVX2 form below (the same bits need
/// the same constants).
constexpr float kExpRound = 12582912.0F;     // 1.5 * 2^23: t = x / ln2 + it holds n in its low bits
constexpr float kExpLog2e = 1.44269504F;     // 1 / ln 2
constexpr float kExpLn2Hi = 0.693145752F;    // ln 2 to 16 bits: n * it is exact
constexpr float kExpLn2Lo = 1.42860677e-06F;  // the rest of ln 2
/// e^r's Taylor coefficients 1/7!, 1/6!, ..., 1/1!, 1/0!, highest first (Horner's order).
constexpr std::array<float, 8> kExpTaylor = {1.0F / 5040.0F, 1.0F / 720.0F, 1.0F / 120.0F, 1.0F / 24.0F,
                                             1.0F / 6.0F,    0.5F,          1.0F,          1.0F};
inline ExpFloatParts exp_float_parts(float x) {
  const float t = std::fma(x, kExpLog2e, kExpRound);
  const float n = t - kExpRound;
  float r = std::fma(n, -kExpLn2Hi, x);
  r = std::fma(n, -kExpLn2Lo, r);
  // Horner's steps written out: a loop over the coefficients, even unrolled, stops GCC from
  // vectorising the loops this is inlined into.
  float p = kExpTaylor[0];
  p = std::fma(p, r, kExpTaylor[1]);
  p = std::fma(p, r, kExpTaylor[2]);
  p = std::fma(p, r, kExpTaylor[3]);
  p = std::fma(p, r, kExpTaylor[4]);
  p = std::fma(p, r, kExpTaylor[5]);
  p = std::fma(p, r, kExpTaylor[6]);
  p = std::fma(p, r, kExpTaylor[7]);
  // n sits in the low bits of t.
  return {p, static_cast<std::int32_t>(std::bit_cast<std::uint32_t>(t) - std::bit_cast<std::uint32_t>(kExpRound))};
}

constexpr float kExpFloatLo = -87.336544F;  // ln(2^-126): below, the result would be subnormal: 0
constexpr float kExpFloatHi = 88.7228394F;  // ln(largest float): above, +inf

/// exp_float's body: the argument clamped to [kExpFloatLo, kExpFloatHi], then 2^n in two exact
/// halves (-126 <= n <= 128, so both are normal floats and the first product is exact). Measured
/// within 0.92 ulp (tests/unit/test_portable_math.cpp).
inline float exp_float_inline(float x0) {
  float x = x0 < kExpFloatLo ? kExpFloatLo : x0;  // ternaries, not std::clamp: they vectorise as selects
  x = x > kExpFloatHi ? kExpFloatHi : x;
  const ExpFloatParts f = exp_float_parts(x);
  const std::int32_t e1 = f.n / 2, e2 = f.n - e1;
  const float y = (f.p * pow2f(e1)) * pow2f(e2);
  return x0 < kExpFloatLo ? 0.0F : (x0 > kExpFloatHi ? HUGE_VALF : y);
}

/// exp_float_inline(x0) for x0 <= 0, the same float in fewer steps. Clamped below as there, such
/// an x gives -126 <= n <= 0, where 2^n is a normal float: p 2^n is then one rounding of the same
/// exact value as exp_float_inline's (p 2^e1) 2^e2 (whose first product is exact), so one product
/// gives the same bits. Above 0 (the upper clamp included) and for NaN it is not exp_float:
/// callers check (exp_row).
inline float exp_float_nonpositive_inline(float x0) {
  const float x = x0 < kExpFloatLo ? kExpFloatLo : x0;
  const ExpFloatParts f = exp_float_parts(x);
  const float y = f.p * pow2f(f.n);
  return x0 < kExpFloatLo ? 0.0F : y;
}

/// Elements per block of exp_row: a whole number of vectors on every build (one AVX-512 register,
/// two AVX2 ones), so that the loop over whole blocks is straight vector code.
constexpr Eigen::Index kExpBlock = 16;

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define ATTNSCOPE_EXP_ROWS_AVX2 1
/// exp_float_nonpositive_inline(fl(fl(x s) - shift)) written out for AVX2 + FMA, U registers of
/// eight at a time with each step taken for all U before the next: every lane goes through the
/// same operations in the same order as the scalar form (the clamp as max(lo, a), which returns a
/// for a NaN a as the ternary does; the integer steps of n and 2^n modulo 2^32, as pow2f's), so
/// the same bits with the same constants (PortableMath.SoftmaxExpsAreExpFloatsSumsShiftedByThe-
/// RowsMaxima compares it with the checked path, which GCC vectorises from the scalar form, and
/// PortableMath.SoftmaxExpsAreExpFloatOnEveryKindOfArgument with exp_float one by one). Why:
/// GCC's loop, one register at a time with the polynomial's constants spilled and the clamp as a
/// compare and a blend, took about 11 cycles per register on an AVX2 EPYC against 6 for its fused
/// steps on two units; this form takes 6-8% off the softmax step (docs/benchmarks.md). AVX-512
/// builds (32 registers) and builds without AVX2 + FMA keep the compiled scalar form.
template <int U, bool kKeepArgs>
inline void exp_registers_avx2(float* x, float* args, __m256 s, __m256 shift) {
  const __m256 lo = _mm256_set1_ps(kExpFloatLo), round = _mm256_set1_ps(kExpRound);
  const __m256i bias = _mm256_set1_epi32(std::bit_cast<std::int32_t>(kExpRound) - 127);
  __m256 a[U], c[U], t[U], r[U], keep[U], y[U];
  for (int u = 0; u < U; ++u) a[u] = _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * u), s), shift);
  if constexpr (kKeepArgs) {
    for (int u = 0; u < U; ++u) _mm256_storeu_ps(args + 8 * u, a[u]);
  }
  for (int u = 0; u < U; ++u) c[u] = _mm256_max_ps(lo, a[u]);
  for (int u = 0; u < U; ++u) keep[u] = _mm256_cmp_ps(a[u], lo, _CMP_NLT_UQ);  // not below lo, or NaN
  for (int u = 0; u < U; ++u) t[u] = _mm256_fmadd_ps(c[u], _mm256_set1_ps(kExpLog2e), round);
  for (int u = 0; u < U; ++u) r[u] = _mm256_sub_ps(t[u], round);  // n
  for (int u = 0; u < U; ++u) c[u] = _mm256_fmadd_ps(r[u], _mm256_set1_ps(-kExpLn2Hi), c[u]);
  for (int u = 0; u < U; ++u) r[u] = _mm256_fmadd_ps(r[u], _mm256_set1_ps(-kExpLn2Lo), c[u]);
  for (int u = 0; u < U; ++u) y[u] = _mm256_fmadd_ps(_mm256_set1_ps(kExpTaylor[0]), r[u], _mm256_set1_ps(kExpTaylor[1]));
  for (int u = 0; u < U; ++u) y[u] = _mm256_fmadd_ps(y[u], r[u], _mm256_set1_ps(kExpTaylor[2]));
  for (int u = 0; u < U; ++u) y[u] = _mm256_fmadd_ps(y[u], r[u], _mm256_set1_ps(kExpTaylor[3]));
  for (int u = 0; u < U; ++u) y[u] = _mm256_fmadd_ps(y[u], r[u], _mm256_set1_ps(kExpTaylor[4]));
  for (int u = 0; u < U; ++u) y[u] = _mm256_fmadd_ps(y[u], r[u], _mm256_set1_ps(kExpTaylor[5]));
  for (int u = 0; u < U; ++u) y[u] = _mm256_fmadd_ps(y[u], r[u], _mm256_set1_ps(kExpTaylor[6]));
  for (int u = 0; u < U; ++u) y[u] = _mm256_fmadd_ps(y[u], r[u], _mm256_set1_ps(kExpTaylor[7]));
  for (int u = 0; u < U; ++u) {
    // 2^n: (bits(t) - bits(1.5 2^23) + 127) << 23, as pow2f(n) computes it.
    const __m256i e = _mm256_slli_epi32(_mm256_sub_epi32(_mm256_castps_si256(t[u]), bias), 23);
    y[u] = _mm256_and_ps(_mm256_mul_ps(y[u], _mm256_castsi256_ps(e)), keep[u]);
  }
  for (int u = 0; u < U; ++u) _mm256_storeu_ps(x + 8 * u, y[u]);
}

/// exp_row<Shift::at_most_max>'s work on AVX2 + FMA (n a multiple of 8): the exponentials in
/// place, and the arguments into args when kKeepArgs. Four registers at a time, then one: of two
/// to six measured, four and six were the fastest (docs/benchmarks.md).
template <bool kKeepArgs>
inline void exp_row_avx2(float* x, Eigen::Index n, float s, float shift, float* args) {
  const __m256 vs = _mm256_set1_ps(s), vshift = _mm256_set1_ps(shift);
  Eigen::Index t = 0;
  for (; t + 32 <= n; t += 32) exp_registers_avx2<4, kKeepArgs>(x + t, args + (kKeepArgs ? t : 0), vs, vshift);
  for (; t < n; t += 8) exp_registers_avx2<1, kKeepArgs>(x + t, args + (kKeepArgs ? t : 0), vs, vshift);
}
#endif

/// How exp_row knows its arguments: `any` shift (each argument checked, the row computed again by
/// exp_float_inline when one is above 0 or NaN), or a shift `at_most_max`, at least every
/// fl(x[t] * s) that is not NaN (max_scaled's), so that every argument is at most 0 or NaN.
enum class Shift { any, at_most_max };

/// x[t] = exp_float_inline(x[t] * s - shift) for t < n, n a multiple of kExpBlock. With
/// Shift::any, args (n floats) is scratch: the arguments of a softmax row are at most 0 (shift is
/// the row's largest product), so the row is computed by exp_float_nonpositive_inline, keeping its
/// arguments, and again from them by exp_float_inline if any is above 0 or NaN: the same bits
/// either way. With Shift::at_most_max no argument is above 0, and a NaN argument gives the same
/// NaN both ways (both forms carry it through the same steps to p, which a power of two, never a
/// NaN, multiplies: the result is p's NaN), so no check is needed; args, when not null, receives
/// the arguments (the logits less the row's largest).
template <Shift K>
ATTNSCOPE_WIDE_VECTORS inline void exp_row(float* x, Eigen::Index n, float s, float shift, float* args) {
  if constexpr (K == Shift::at_most_max) {
#if defined(ATTNSCOPE_EXP_ROWS_AVX2)
    if (args != nullptr) {
      exp_row_avx2<true>(x, n, s, shift, args);
    } else {
      exp_row_avx2<false>(x, n, s, shift, nullptr);
    }
#else
    if (args != nullptr) {
      for (Eigen::Index t = 0; t < n; ++t) {
        const float a = x[t] * s - shift;
        args[t] = a;
        x[t] = exp_float_nonpositive_inline(a);
      }
    } else {
      for (Eigen::Index t = 0; t < n; ++t) x[t] = exp_float_nonpositive_inline(x[t] * s - shift);
    }
#endif
  } else {
    std::uint32_t other = 0;  // an integer, not a bool: GCC vectorises its reduction
    for (Eigen::Index t = 0; t < n; ++t) {
      const float a = x[t] * s - shift;
      args[t] = a;
      other |= a <= 0.0F ? 0U : 1U;
      x[t] = exp_float_nonpositive_inline(a);
    }
    if (other != 0) {
      for (Eigen::Index t = 0; t < n; ++t) x[t] = exp_float_inline(args[t]);
    }
  }
}

}  // namespace

float exp_float(float x) { return exp_float_inline(x); }

ATTNSCOPE_WIDE_VECTORS void exp_floats(float* x, Eigen::Index n, float shift) {
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
  // The masked form with every lane set: the same instruction, without _mm512_max_ps's undefined
  // pass-through operand, which GCC 12 reports as uninitialised once inlined into some loops.
  static V max(V a, V b) { return _mm512_mask_max_ps(a, static_cast<__mmask16>(0xFFFF), a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
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
  static V max(V a, V b) { return _mm512_mask_max_pd(a, static_cast<__mmask8>(0xFF), a, b); }
  static V widen(const float* p) { return _mm512_cvtps_pd(_mm256_loadu_ps(p)); }
  static V add(V a, V b) { return _mm512_add_pd(a, b); }
  static V sub(V a, V b) { return _mm512_sub_pd(a, b); }
  static V mul(V a, V b) { return _mm512_mul_pd(a, b); }
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
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
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
  static V widen(const float* p) { return _mm256_cvtps_pd(_mm_loadu_ps(p)); }
  static V add(V a, V b) { return _mm256_add_pd(a, b); }
  static V sub(V a, V b) { return _mm256_sub_pd(a, b); }
  static V mul(V a, V b) { return _mm256_mul_pd(a, b); }
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
  static V widen(const float* p) { return static_cast<V>(*p); }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V mul(V a, V b) { return a * b; }
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

namespace {

/// The packed products' register tile: kPackedRows rows x kPackedVectors vectors. On AVX-512
/// (32 registers) ATTNSCOPE_TILE (default 12 x 2) keeps 24 accumulators in flight, enough to
/// hide the fused multiply-add's latency on both of the core's FMA ports; on AVX2 (16 registers)
/// 6 x 2, as the products above. Neither changes a value: each c_ij is still one chain of fused
/// steps over t in increasing order.
#if defined(__AVX512F__)
#ifndef ATTNSCOPE_TILE_ROWS
#define ATTNSCOPE_TILE_ROWS 12
#define ATTNSCOPE_TILE_VECTORS 2
#endif
constexpr Eigen::Index kPackedRows = ATTNSCOPE_TILE_ROWS;
constexpr Eigen::Index kPackedVectors = ATTNSCOPE_TILE_VECTORS;
#elif defined(__AVX2__) && defined(__FMA__)
constexpr Eigen::Index kPackedRows = 6;
constexpr Eigen::Index kPackedVectors = 2;
#else
constexpr Eigen::Index kPackedRows = 4;
constexpr Eigen::Index kPackedVectors = 2;
#endif

/// Where a tile's results go: C itself (T), or widened to double with a bias added (and added to C).
template <typename T>
struct StoreTile {
  T* c;
  Eigen::Index ldc;
  StoreTile at(Eigen::Index i, Eigen::Index j) const { return {c + i * ldc + j, ldc}; }
};
struct WidenTile {
  double* c;
  Eigen::Index ldc;
  const double* bias;
  bool accumulate;
  WidenTile at(Eigen::Index i, Eigen::Index j) const { return {c + i * ldc + j, ldc, bias + j, accumulate}; }
  /// Row r's first `cols` products: c = double(p) + bias, or c + (double(p) + bias).
  void row(Eigen::Index r, const float* p, Eigen::Index cols) const {
    double* out = c + r * ldc;
    if (accumulate) {
      for (Eigen::Index j = 0; j < cols; ++j) out[j] += static_cast<double>(p[j]) + bias[j];
    } else {
      for (Eigen::Index j = 0; j < cols; ++j) out[j] = static_cast<double>(p[j]) + bias[j];
    }
  }
};

/// Vectors in the panel of B's columns from j on: kPackedVectors, but one for a last panel of at
/// most one vector's columns (a full-width panel there would multiply mostly padding).
template <typename T>
Eigen::Index panel_vectors(Eigen::Index j, Eigen::Index n) {
  return n - j <= Simd<T>::W ? 1 : kPackedVectors;
}

/// C rows [0, R) x the panel's columns [0, cols) = A P: A's R rows at ap (row stride lda), P one
/// packed panel (k x V W, contiguous).
template <typename T, Eigen::Index R, Eigen::Index V, typename Out>
void packed_tile(const T* ap, Eigen::Index lda, const T* panel, const Out& out, Eigen::Index k, Eigen::Index cols) {
  using S = Simd<T>;
  constexpr Eigen::Index W = S::W;
  typename S::V acc[R][V];
  for (Eigen::Index r = 0; r < R; ++r)
    for (Eigen::Index v = 0; v < V; ++v) acc[r][v] = S::zero();
  for (Eigen::Index t = 0; t < k; ++t) {
    typename S::V b[V];
    for (Eigen::Index v = 0; v < V; ++v) b[v] = S::load(panel + (t * V + v) * W);
    for (Eigen::Index r = 0; r < R; ++r) {
      const typename S::V x = S::set1(ap[r * lda + t]);
      for (Eigen::Index v = 0; v < V; ++v) acc[r][v] = S::fma(x, b[v], acc[r][v]);
    }
  }
  if constexpr (std::is_same_v<Out, StoreTile<T>>) {
    if (cols == V * W) {
      for (Eigen::Index r = 0; r < R; ++r)
        for (Eigen::Index v = 0; v < V; ++v) S::store(out.c + r * out.ldc + v * W, acc[r][v]);
      return;
    }
  }
  T tile[V * W];
  for (Eigen::Index r = 0; r < R; ++r) {
    for (Eigen::Index v = 0; v < V; ++v) S::store(tile + v * W, acc[r][v]);
    if constexpr (std::is_same_v<Out, StoreTile<T>>) {
      std::copy(tile, tile + cols, out.c + r * out.ldc);
    } else {
      out.row(r, tile, cols);
    }
  }
}

/// A tile of `rows` (<= R) rows of C against panel j of b: the tile of exactly `rows` rows.
template <typename T, Eigen::Index R, typename Out>
void packed_rows(Eigen::Index rows, const T* ap, Eigen::Index lda, const PackedMatrix<T>& b, Eigen::Index j,
                 const Out& out) {
  if constexpr (R > 1) {
    if (rows < R) {
      packed_rows<T, R - 1>(rows, ap, lda, b, j, out);
      return;
    }
  }
  const Eigen::Index k = b.rows(), cols = std::min(PackedMatrix<T>::panel_width(), b.cols() - j);
  if (panel_vectors<T>(j, b.cols()) == 1) {
    packed_tile<T, R, 1>(ap, lda, b.data() + j * k, out, k, cols);
  } else {
    packed_tile<T, R, kPackedVectors>(ap, lda, b.data() + j * k, out, k, cols);
  }
}

/// Panel by panel of b, every block of kPackedRows rows of A against it, A read in place (its rows
/// broadcast entry by entry: a copy into a packed layout cost more than it saved): each panel of
/// the weights is read once per product, from wherever it is, and A (a few hundred KB at most)
/// stays in the L2 cache.
template <typename T, typename Out>
void packed_product(const T* a, Eigen::Index lda, const PackedMatrix<T>& b, const Out& out, Eigen::Index m) {
  const Eigen::Index k = b.rows(), J = PackedMatrix<T>::panel_width();
  // While one panel is in use, the next is prefetched a slice per block of rows (the weights come
  // from L3 or memory: each panel is read once).
  const Eigen::Index blocks = (m + kPackedRows - 1) / kPackedRows;
  const Eigen::Index panel_bytes = k * J * static_cast<Eigen::Index>(sizeof(T));
  const Eigen::Index slice = (panel_bytes / 64 + blocks - 1) / blocks;  // cache lines per block
  for (Eigen::Index j = 0; j < b.cols(); j += J) {
    const char* next = reinterpret_cast<const char*>(b.data() + (j + J) * k);
    const bool has_next = j + J < b.cols();
    // The next panel's lines (a narrow last panel has fewer).
    const Eigen::Index next_lines =
        has_next ? panel_bytes / kPackedVectors * panel_vectors<T>(j + J, b.cols()) / 64 : 0;
    for (Eigen::Index i0 = 0, blk = 0; i0 < m; i0 += kPackedRows, ++blk) {
      if (has_next) {
        for (Eigen::Index l = blk * slice; l < std::min((blk + 1) * slice, next_lines); ++l) {
          __builtin_prefetch(next + l * 64, 0, 2);
        }
      }
      packed_rows<T, kPackedRows>(std::min(kPackedRows, m - i0), a + i0 * lda, lda, b, j, out.at(i0, j));
    }
  }
}

}  // namespace

namespace {

/// The scalar part of transpose: rows [r0, r1) x columns [c0, c1) of in.
template <typename Out>
void transpose_plain(const float* in, Eigen::Index ldi, Eigen::Index r0, Eigen::Index r1, Eigen::Index c0,
                     Eigen::Index c1, Out* out, Eigen::Index ldo) {
  for (Eigen::Index r = r0; r < r1; ++r)
    for (Eigen::Index c = c0; c < c1; ++c) out[c * ldo + r] = static_cast<Out>(in[r * ldi + c]);
}

template <typename Out>
void transpose_any(const float* in, Eigen::Index ldi, Eigen::Index rows, Eigen::Index cols, Out* out,
                   Eigen::Index ldo) {
  Eigen::Index r8 = 0, c8 = 0;
#if defined(__AVX2__)
  // 8 x 8 blocks in registers: pairs of rows interleaved, then pairs of pairs, then the 128-bit
  // halves exchanged, so that vector t holds the block's column t (shuffles: no arithmetic).
  r8 = rows / 8 * 8, c8 = cols / 8 * 8;
  for (Eigen::Index r0 = 0; r0 < r8; r0 += 8) {
    for (Eigen::Index c0 = 0; c0 < c8; c0 += 8) {
      const float* b = in + r0 * ldi + c0;
      __m256 a[8], t[8], s[8];
      for (int i = 0; i < 8; ++i) a[i] = _mm256_loadu_ps(b + i * ldi);
      for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(a[i], a[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(a[i], a[i + 1]);
      }
      for (int i = 0; i < 8; i += 4) {
        s[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        s[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        s[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        s[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
      }
      for (int i = 0; i < 4; ++i) {
        const __m256 lo = _mm256_permute2f128_ps(s[i], s[i + 4], 0x20);  // column i
        const __m256 hi = _mm256_permute2f128_ps(s[i], s[i + 4], 0x31);  // column i + 4
        Out* o_lo = out + (c0 + i) * ldo + r0;
        Out* o_hi = out + (c0 + i + 4) * ldo + r0;
        if constexpr (std::is_same_v<Out, float>) {
          _mm256_storeu_ps(o_lo, lo);
          _mm256_storeu_ps(o_hi, hi);
        } else {
          _mm256_storeu_pd(o_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(lo)));
          _mm256_storeu_pd(o_lo + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(lo, 1)));
          _mm256_storeu_pd(o_hi, _mm256_cvtps_pd(_mm256_castps256_ps128(hi)));
          _mm256_storeu_pd(o_hi + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(hi, 1)));
        }
      }
    }
  }
#endif
  transpose_plain(in, ldi, 0, r8, c8, cols, out, ldo);  // the columns past the last block
  transpose_plain(in, ldi, r8, rows, 0, cols, out, ldo);  // the rows past the last block
}

}  // namespace

void transpose(const float* in, Eigen::Index ldi, Eigen::Index rows, Eigen::Index cols, float* out,
               Eigen::Index ldo) {
  transpose_any(in, ldi, rows, cols, out, ldo);
}

void transpose(const float* in, Eigen::Index ldi, Eigen::Index rows, Eigen::Index cols, double* out,
               Eigen::Index ldo) {
  transpose_any(in, ldi, rows, cols, out, ldo);
}

template <typename T>
Eigen::Index PackedMatrix<T>::panel_width() {
  return kPackedVectors * Simd<T>::W;
}

template <typename T>
void PackedMatrix<T>::pack(const T* b, Eigen::Index b_row, Eigen::Index b_col, Eigen::Index k, Eigen::Index n) {
  const Eigen::Index J = panel_width();
  // Full panels of J columns, the last one J wide or, when it holds at most one vector's columns,
  // one vector wide (panel_vectors).
  const Eigen::Index last = n > 0 ? (n - 1) / J * J : 0;
  const Eigen::Index n_pad = n > 0 ? last + panel_vectors<T>(last, n) * Simd<T>::W : 0;
  k_ = k, n_ = n;
  data_.resize(static_cast<std::size_t>(std::max<Eigen::Index>(k * n_pad, 1)));  // reused: no zero fill
  for (Eigen::Index j0 = 0; j0 < n; j0 += J) {
    T* panel = data_.data() + j0 * k;
    const Eigen::Index cols = std::min(J, n - j0), width = panel_vectors<T>(j0, n) * Simd<T>::W;
    bool transposed = false;
    if constexpr (std::is_same_v<T, float>) {
      transposed = b_row == 1;  // B a transpose (the keys of K^T): the panel is a block of it, transposed
      if (transposed) transpose(b + j0 * b_col, b_col, cols, k, panel, width);
    }
    for (Eigen::Index t = 0; t < k; ++t) {
      if (!transposed) {
        for (Eigen::Index jj = 0; jj < cols; ++jj) panel[t * width + jj] = b[t * b_row + (j0 + jj) * b_col];
      }
      for (Eigen::Index jj = cols; jj < width; ++jj) panel[t * width + jj] = T(0);  // the last panel's padding
    }
  }
}

template <typename T>
void gemm_packed(const T* a, Eigen::Index lda, const PackedMatrix<T>& b, T* c, Eigen::Index ldc, Eigen::Index m) {
  packed_product(a, lda, b, StoreTile<T>{c, ldc}, m);
}

void gemm_packed_widen(const float* a, Eigen::Index lda, const PackedMatrix<float>& b, const double* bias, double* c,
                       Eigen::Index ldc, Eigen::Index m, bool accumulate) {
  packed_product(a, lda, b, WidenTile{c, ldc, bias, accumulate}, m);
}

template class PackedMatrix<float>;
template class PackedMatrix<double>;
template void gemm_packed<float>(const float*, Eigen::Index, const PackedMatrix<float>&, float*, Eigen::Index,
                                 Eigen::Index);
template void gemm_packed<double>(const double*, Eigen::Index, const PackedMatrix<double>&, double*, Eigen::Index,
                                  Eigen::Index);

template void gemm_nt<float>(const float*, Eigen::Index, const float*, Eigen::Index, float*, Eigen::Index,
                             Eigen::Index, Eigen::Index, Eigen::Index);
template void gemm_nt<double>(const double*, Eigen::Index, const double*, Eigen::Index, double*, Eigen::Index,
                              Eigen::Index, Eigen::Index, Eigen::Index);
template void gemm_nn<float>(const float*, Eigen::Index, Eigen::Index, const float*, Eigen::Index, float*,
                             Eigen::Index, Eigen::Index, Eigen::Index, Eigen::Index);
template void gemm_nn<double>(const double*, Eigen::Index, Eigen::Index, const double*, Eigen::Index, double*,
                              Eigen::Index, Eigen::Index, Eigen::Index, Eigen::Index);

ATTNSCOPE_WIDE_VECTORS bool all_finite(const double* x, Eigen::Index n) {
  std::int64_t bad = 0;  // an integer count: a reduction the compiler vectorises
  for (Eigen::Index t = 0; t < n; ++t) bad += std::fabs(x[t]) <= std::numeric_limits<double>::max() ? 0 : 1;
  return bad == 0;
}

ATTNSCOPE_WIDE_VECTORS double max_of(const double* x, Eigen::Index n) {
  constexpr int kLanes = 16;
  double lane[kLanes];
  for (double& l : lane) l = -HUGE_VAL;
  Eigen::Index t = 0;
  for (; t + kLanes <= n; t += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] = x[t + l] > lane[l] ? x[t + l] : lane[l];
  double top = -HUGE_VAL;
  for (; t < n; ++t) top = x[t] > top ? x[t] : top;
  for (const double l : lane) top = l > top ? l : top;
  return top;
}

ATTNSCOPE_WIDE_VECTORS float max_scaled(const float* x, Eigen::Index n, float s) {
  // fl(x[t] * s) is fma(x[t], s, 0) (an exact product rounded once; a zero's sign aside, which no
  // use of the maximum sees), and the largest value is the same in any order of search: four
  // running maxima (the chain of one would wait on each step), then the lanes halved in a tree.
  // NaN products are passed over: S::max(a, b) gives b where either is NaN, so the running
  // maximum goes second and is never a NaN (the other order would drop the maximum so far at a
  // NaN, and what was left would depend on the vector width).
  using S = Simd<float>;
  constexpr Eigen::Index W = S::W;
  const S::V sv = S::set1(s), zero = S::zero();
  S::V m[4] = {S::set1(-HUGE_VALF), S::set1(-HUGE_VALF), S::set1(-HUGE_VALF), S::set1(-HUGE_VALF)};
  Eigen::Index t = 0;
  for (; t + 4 * W <= n; t += 4 * W) {
    for (int a = 0; a < 4; ++a) m[a] = S::max(S::fma(S::load(x + t + a * W), sv, zero), m[a]);
  }
  for (; t + W <= n; t += W) m[0] = S::max(S::fma(S::load(x + t), sv, zero), m[0]);
  float lane[W];
  S::store(lane, S::max(S::max(m[0], m[1]), S::max(m[2], m[3])));
  for (Eigen::Index half = W / 2; half >= 1; half /= 2) {
    for (Eigen::Index l = 0; l < half; ++l) lane[l] = lane[l + half] > lane[l] ? lane[l + half] : lane[l];
  }
  float top = lane[0];
  for (; t < n; ++t) top = x[t] * s > top ? x[t] * s : top;
  return top;
}

namespace {

/// The terms of the widened sums (portable_math.hpp), in double: x[t], x[t]^2, (x[t] - y[t])^2
/// or x[t] y[t] (y float or double).
enum class Term { widened, square, difference_square, product };

template <typename Y>
inline Simd<double>::V widen_vector(const Y* p) {
  if constexpr (std::is_same_v<Y, float>) {
    return Simd<double>::widen(p);
  } else {
    return Simd<double>::load(p);
  }
}

template <Term K, typename Y>
inline Simd<double>::V term_vector(const float* x, const Y* y) {
  using S = Simd<double>;
  const S::V a = S::widen(x);
  if constexpr (K == Term::widened) {
    return a;
  } else if constexpr (K == Term::square) {
    return S::mul(a, a);
  } else if constexpr (K == Term::difference_square) {
    const S::V diff = S::sub(a, widen_vector(y));
    return S::mul(diff, diff);
  } else {
    return S::mul(a, widen_vector(y));
  }
}

template <Term K, typename Y>
inline double term_scalar(const float* x, const Y* y, Eigen::Index t) {
  const auto a = static_cast<double>(x[t]);
  if constexpr (K == Term::widened) {
    return a;
  } else if constexpr (K == Term::square) {
    return a * a;
  } else if constexpr (K == Term::difference_square) {
    const double diff = a - static_cast<double>(y[t]);
    return diff * diff;
  } else {
    return a * static_cast<double>(y[t]);
  }
}

/// R rows' sums over t < n in lane_sum's order (lane_sum.hpp), in T's vector registers: lane l of
/// row r accumulates acc = step(acc, r, t) for t = l mod kLanes in increasing t (whole vectors of
/// lanes at a time); the lanes are combined as lane_sum's tree (lane l takes lane l + h for
/// h = kLanes / 2, ..., 2, 1: whole vectors while h spans vectors, then within the last one); the
/// row's sum starts at 0, takes s = tail(s, r, t) for the t past the last whole group of kLanes in
/// order, and ends as s + lane 0. The rows' steps are interleaved; each row's operations are its
/// own, in that order, whatever the vector width.
template <typename T, int R, typename Step, typename Tail>
inline void lanes_of_rows(Eigen::Index n, Step step, Tail tail, T* out) {
  using S = Simd<T>;
  constexpr Eigen::Index W = S::W;
  constexpr Eigen::Index kVectors = kLanes / W;
  static_assert(kLanes % W == 0, "lane_sum's lanes fill whole vectors");
  typename S::V acc[R][kVectors];
  for (int r = 0; r < R; ++r) {
    for (Eigen::Index v = 0; v < kVectors; ++v) acc[r][v] = S::zero();
  }
  Eigen::Index t = 0;
  for (; t + kLanes <= n; t += kLanes) {
    for (int r = 0; r < R; ++r) {
      for (Eigen::Index v = 0; v < kVectors; ++v) acc[r][v] = step(acc[r][v], r, t + v * W);
    }
  }
  // The tree's levels that span whole vectors: vector v takes vector v + h (lane l takes l + h W).
  for (Eigen::Index h = kVectors / 2; h >= 1; h /= 2) {
    for (int r = 0; r < R; ++r) {
      for (Eigen::Index v = 0; v < h; ++v) acc[r][v] = S::add(acc[r][v], acc[r][v + h]);
    }
  }
  // The levels within the last vector (lane_tree over its W lanes).
  alignas(64) T lane[R][W];
  T s[R];
  for (int r = 0; r < R; ++r) {
    S::store(lane[r], acc[r][0]);
    s[r] = T(0);
  }
  for (Eigen::Index u = t; u < n; ++u) {
    for (int r = 0; r < R; ++r) s[r] = tail(s[r], r, u);
  }
  for (int r = 0; r < R; ++r) out[r] = s[r] + lane_tree(lane[r], static_cast<std::size_t>(W));
}

/// kernel(r0, std::integral_constant<int, C>) for groups of C = R rows from r0, then one row at a
/// time (C = 1) for the rest.
template <int R, typename Kernel>
void by_row_groups(Eigen::Index rows, Kernel kernel) {
  Eigen::Index r0 = 0;
  for (; r0 + R <= rows; r0 += R) kernel(r0, std::integral_constant<int, R>{});
  for (; r0 < rows; ++r0) kernel(r0, std::integral_constant<int, 1>{});
}

/// Rows summed at once: four on AVX-512 (two vectors of lanes each), two on AVX2, one otherwise.
constexpr Eigen::Index kLaneVectors = kLanes / Simd<double>::W;
constexpr int kRowsAtOnce = kLaneVectors <= 2 ? 4 : (kLaneVectors <= 4 ? 2 : 1);

/// out[r] = lane_sum(n, term K of row r) in double: row r's x at x[r], its y at y[r].
template <Term K, int R, typename Y>
inline void lane_sums(const float* const* x, const Y* const* y, Eigen::Index n, double* out) {
  using V = Simd<double>::V;
  lanes_of_rows<double, R>(
      n, [&](V acc, int r, Eigen::Index at) { return Simd<double>::add(acc, term_vector<K>(x[r] + at, y[r] + at)); },
      [&](double s, int r, Eigen::Index u) { return s + term_scalar<K>(x[r], y[r], u); }, out);
}

template <Term K, typename Y = float>
double lane_sum_of(const float* x, const Y* y, Eigen::Index n) {
  double out = 0.0;
  lane_sums<K, 1>(&x, &y, n, &out);
  return out;
}

/// Row r of x at x + r ld (and of y at y + r y_ld; y_ld = 0: one y for every row).
template <int C>
struct RowPointers {
  const float* x[C];
  const float* y[C];
  RowPointers(const float* x0, Eigen::Index ld, const float* y0, Eigen::Index y_ld, Eigen::Index r0) {
    for (int r = 0; r < C; ++r) {
      x[r] = x0 + (r0 + r) * ld;
      y[r] = y0 + (r0 + r) * y_ld;
    }
  }
};

/// out[r] = lane_sum of row r's term K for r < rows.
template <Term K>
void lane_sums_of_rows(const float* x, Eigen::Index ld, const float* y, Eigen::Index y_ld, Eigen::Index rows,
                       Eigen::Index n, double* out) {
  by_row_groups<kRowsAtOnce>(rows, [&](Eigen::Index r0, auto count) {
    constexpr int C = decltype(count)::value;
    const RowPointers<C> p(x, ld, y, y_ld, r0);
    lane_sums<K, C>(p.x, p.y, n, out + r0);
  });
}

}  // namespace

double sum_widened(const float* x, Eigen::Index n) { return lane_sum_of<Term::widened>(x, x, n); }

double sum_of_squares(const float* x, Eigen::Index n) { return lane_sum_of<Term::square>(x, x, n); }

double distance2(const float* x, const float* y, Eigen::Index n) {
  return lane_sum_of<Term::difference_square>(x, y, n);
}

double dot_widened(const float* x, const double* y, Eigen::Index n) { return lane_sum_of<Term::product>(x, y, n); }

void sums_of_squares(const float* x, Eigen::Index ld, Eigen::Index rows, Eigen::Index n, double* out) {
  lane_sums_of_rows<Term::square>(x, ld, x, ld, rows, n, out);
}

void distances2(const float* x, Eigen::Index ld, Eigen::Index rows, const float* y, Eigen::Index n, double* out) {
  lane_sums_of_rows<Term::difference_square>(x, ld, y, 0, rows, n, out);
}

void dots_widened(const float* x, Eigen::Index ld, const float* y, Eigen::Index y_ld, Eigen::Index rows,
                  Eigen::Index n, double* out) {
  lane_sums_of_rows<Term::product>(x, ld, y, y_ld, rows, n, out);
}

void sums_of_squares_float(const float* x, Eigen::Index ld, Eigen::Index rows, Eigen::Index n, float* out) {
  using S = Simd<float>;
  by_row_groups<4>(rows, [&](Eigen::Index r0, auto count) {
    constexpr int C = decltype(count)::value;
    const RowPointers<C> p(x, ld, x, ld, r0);
    // Fused steps: acc = fma(x, x, acc), in the lanes and in the tail alike.
    lanes_of_rows<float, C>(
        n,
        [&](S::V acc, int r, Eigen::Index at) {
          const S::V a = S::load(p.x[r] + at);
          return S::fma(a, a, acc);
        },
        [&](float s, int r, Eigen::Index u) { return std::fma(p.x[r][u], p.x[r][u], s); }, out + r0);
  });
}

void distances2_float(const float* x, Eigen::Index ld, Eigen::Index rows, const float* y, Eigen::Index n,
                      float* out) {
  using S = Simd<float>;
  by_row_groups<4>(rows, [&](Eigen::Index r0, auto count) {
    constexpr int C = decltype(count)::value;
    const RowPointers<C> p(x, ld, y, 0, r0);
    lanes_of_rows<float, C>(
        n,
        [&](S::V acc, int r, Eigen::Index at) {
          const S::V diff = S::sub(S::load(p.x[r] + at), S::load(y + at));
          return S::add(acc, S::mul(diff, diff));
        },
        [&](float s, int r, Eigen::Index u) {
          const float diff = p.x[r][u] - y[u];
          return s + diff * diff;
        },
        out + r0);
  });
}

namespace {

/// exp_floats_sums' work, for either kind of shift (exp_row); with Shift::at_most_max, logits
/// (when not null, row r at logits + r ld_logits) receives each row's arguments.
template <Shift K>
ATTNSCOPE_WIDE_VECTORS void exp_rows_sums(float* x, Eigen::Index ld, Eigen::Index rows, Eigen::Index n, float s,
                                          const float* shifts, double* sums, float* logits, Eigen::Index ld_logits) {
  // Every element is exp_float_inline(x * s - shift) of its own input, whatever the grouping, so
  // the grouping below is free to follow the vectors. A row's last n mod kExpBlock elements would
  // each be a scalar exponential (a DeiT-T row of 197: five of them against twelve vector
  // blocks); instead every row's argument there is gathered into one buffer, exponentiated there
  // as one run of whole vectors, and put back.
  const Eigen::Index whole = n / kExpBlock * kExpBlock, rest = n - whole;
  thread_local std::vector<float> tails, args;
  if (rest > 0) {
    const Eigen::Index padded = (rows * rest + kExpBlock - 1) / kExpBlock * kExpBlock;
    tails.assign(static_cast<std::size_t>(padded), 0.0F);  // the last block's padding: 0
    args.resize(std::max(args.size(), static_cast<std::size_t>(padded)));
    float* at = tails.data();
    for (Eigen::Index r = 0; r < rows; ++r, at += rest) {
      const float* row = x + r * ld + whole;
      for (Eigen::Index t = 0; t < rest; ++t) at[t] = row[t] * s - shifts[r];
      if (logits != nullptr) std::copy(at, at + rest, logits + r * ld_logits + whole);
    }
    // x * 1 - 0 is x for every float, so these are the same exponentials of the same arguments
    // (and the padding's 0 is at most 0).
    exp_row<K>(tails.data(), padded, 1.0F, 0.0F, K == Shift::any ? args.data() : nullptr);
    at = tails.data();
    for (Eigen::Index r = 0; r < rows; ++r, at += rest) std::copy(at, at + rest, x + r * ld + whole);
  }
  args.resize(std::max(args.size(), static_cast<std::size_t>(whole)));
  // Each row's whole blocks in place, then its sum in lane_sum's order; the sums of kRowsAtOnce
  // rows at a time, so that their final chains of additions interleave (lane_sums_of_rows: each
  // row's order its own, the same bits as sum_widened of the row).
  for (Eigen::Index r0 = 0; r0 < rows; r0 += kRowsAtOnce) {
    const Eigen::Index count = std::min<Eigen::Index>(kRowsAtOnce, rows - r0);
    for (Eigen::Index r = r0; r < r0 + count; ++r) {
      float* row_args = K == Shift::any ? args.data() : (logits != nullptr ? logits + r * ld_logits : nullptr);
      exp_row<K>(x + r * ld, whole, s, shifts[r], row_args);
    }
    lane_sums_of_rows<Term::widened>(x + r0 * ld, ld, x + r0 * ld, ld, count, n, sums + r0);
  }
}

}  // namespace

void exp_floats_sums(float* x, Eigen::Index ld, Eigen::Index rows, Eigen::Index n, float s, const float* shifts,
                     double* sums) {
  exp_rows_sums<Shift::any>(x, ld, rows, n, s, shifts, sums, nullptr, 0);
}

bool softmax_exps(float* x, Eigen::Index ld, Eigen::Index rows, Eigen::Index n, float s, float* tops, double* sums,
                  float* logits, Eigen::Index ld_logits) {
  for (Eigen::Index r = 0; r < rows; ++r) tops[r] = max_scaled(x + r * ld, n, s);
  exp_rows_sums<Shift::at_most_max>(x, ld, rows, n, s, tops, sums, logits, ld_logits);
  bool finite = true;
  for (Eigen::Index r = 0; r < rows; ++r) finite = finite && std::isfinite(tops[r]) && std::isfinite(sums[r]);
  return finite;
}

double exp_floats_sum(float* x, Eigen::Index n, float s, float shift) {
  double sum = 0.0;
  exp_floats_sums(x, n, 1, n, s, &shift, &sum);
  return sum;
}

double probe::portable_math(double a, double b, double c) { return a * b + c; }

void fix_eigen_blocking() {
  // Sizes of a common x86-64 core; what matters is that they never change.
  Eigen::setCpuCacheSizes(32 * 1024, 1024 * 1024, 8 * 1024 * 1024);
}

}  // namespace attnscope::portable
