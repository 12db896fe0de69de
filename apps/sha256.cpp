// SHA-256 as specified in FIPS 180-4, section 6.2.
#include "sha256.hpp"

#include "attnscope/error.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

namespace attnscope::app {
namespace {

constexpr std::array<std::uint32_t, 64> kRound = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

constexpr std::uint32_t rotr(std::uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ATTNSCOPE_SHA_NI 1

// The same compression function with the x86 SHA extensions (SHA-NI): the state is held as
// ABEF and CDGH, as _mm_sha256rnds2_epu32 takes it, and each call does two rounds. About 6x the
// portable code (docs/benchmarks.md, the input fingerprint); block() stays as the reference and
// the fallback, and Sha256.HardwarePathEqualsPortable compares them.
__attribute__((target("sha,sse4.1"))) void sha_ni_blocks(std::uint32_t* h, const unsigned char* p,
                                                          std::size_t count) {
  const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i tmp = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)), 0xB1);  // CDAB
  __m128i cdgh = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 4)), 0x1B);  // EFGH
  __m128i abef = _mm_alignr_epi8(tmp, cdgh, 8);
  cdgh = _mm_blend_epi16(cdgh, tmp, 0xF0);
  for (; count > 0; --count, p += 64) {
    const __m128i abef_in = abef, cdgh_in = cdgh;
    __m128i w[4];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      __m128i& wi = w[i % 4];
      if (i < 4) {
        wi = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * i)), bswap);
      } else {
        // words 4i..4i+3: w[t-16] + s0(w[t-15]), + w[t-7], then + s1(w[t-2])
        const __m128i& w1 = w[(i - 1) % 4];
        const __m128i& w2 = w[(i - 2) % 4];
        __m128i x = _mm_sha256msg1_epu32(wi, w[(i - 3) % 4]);
        x = _mm_add_epi32(x, _mm_alignr_epi8(w1, w2, 4));
        wi = _mm_sha256msg2_epu32(x, w1);
      }
      __m128i msg = _mm_add_epi32(wi, _mm_loadu_si128(reinterpret_cast<const __m128i*>(kRound.data() + 4 * i)));
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, msg);
      msg = _mm_shuffle_epi32(msg, 0x0E);
      abef = _mm_sha256rnds2_epu32(abef, cdgh, msg);
    }
    abef = _mm_add_epi32(abef, abef_in);
    cdgh = _mm_add_epi32(cdgh, cdgh_in);
  }
  tmp = _mm_shuffle_epi32(abef, 0x1B);     // FEBA
  cdgh = _mm_shuffle_epi32(cdgh, 0xB1);    // DCHG
  abef = _mm_blend_epi16(tmp, cdgh, 0xF0); // DCBA
  cdgh = _mm_alignr_epi8(cdgh, tmp, 8);    // HGFE
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h), abef);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h + 4), cdgh);
}
#endif

}  // namespace

bool Sha256::hardware_available() {
#ifdef ATTNSCOPE_SHA_NI
  static const bool yes = __builtin_cpu_supports("sha") && __builtin_cpu_supports("sse4.1");
  return yes;
#else
  return false;
#endif
}

Sha256::Sha256(bool allow_hardware)
    : hardware_(allow_hardware && hardware_available()),
      h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
         0x5be0cd19} {}

void Sha256::blocks(const unsigned char* p, std::size_t count) {
#ifdef ATTNSCOPE_SHA_NI
  if (hardware_) {
    sha_ni_blocks(h_.data(), p, count);
    return;
  }
#endif
  for (; count > 0; --count, p += 64) block(p);
}

void Sha256::block(const unsigned char* p) {
  std::array<std::uint32_t, 64> w{};
  for (int t = 0; t < 16; ++t) {
    w[t] = static_cast<std::uint32_t>(p[4 * t]) << 24 | static_cast<std::uint32_t>(p[4 * t + 1]) << 16 |
           static_cast<std::uint32_t>(p[4 * t + 2]) << 8 | static_cast<std::uint32_t>(p[4 * t + 3]);
  }
  for (int t = 16; t < 64; ++t) {
    const std::uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    const std::uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  std::uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6],
                h = h_[7];
  for (int t = 0; t < 64; ++t) {
    const std::uint32_t t1 =
        h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kRound[t] + w[t];
    const std::uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h_[0] += a;
  h_[1] += b;
  h_[2] += c;
  h_[3] += d;
  h_[4] += e;
  h_[5] += f;
  h_[6] += g;
  h_[7] += h;
}

void Sha256::update(const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  bytes_ += n;
  if (used_ > 0) {
    const std::size_t take = std::min(n, buf_.size() - used_);
    std::memcpy(buf_.data() + used_, p, take);
    used_ += take;
    p += take;
    n -= take;
    if (used_ < buf_.size()) return;
    blocks(buf_.data(), 1);
    used_ = 0;
  }
  blocks(p, n / 64);
  p += n / 64 * 64;
  n %= 64;
  std::memcpy(buf_.data(), p, n);
  used_ = n;
}

std::string Sha256::hex_digest() {
  const std::uint64_t bits = bytes_ * 8;
  const unsigned char pad = 0x80;
  update(&pad, 1);
  const unsigned char zero = 0;
  while (used_ != 56) update(&zero, 1);
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(bits >> (56 - 8 * i));
  update(len, 8);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (std::uint32_t word : h_) {
    for (int shift = 28; shift >= 0; shift -= 4) out += kHex[(word >> shift) & 0xfU];
  }
  return out;
}

std::string sha256_file(const std::filesystem::path& path, std::uintmax_t* bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path.string() + ": cannot read: " + std::strerror(errno));
  Sha256 h;
  std::vector<unsigned char> buf(1 << 20);
  std::uintmax_t total = 0;
  while (true) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw Error(path.string() + ": cannot read: " + std::strerror(err));
    }
    h.update(buf.data(), static_cast<std::size_t>(n));
    total += static_cast<std::uintmax_t>(n);
  }
  ::close(fd);
  if (bytes != nullptr) *bytes = total;
  return h.hex_digest();
}

}  // namespace attnscope::app
