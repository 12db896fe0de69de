// Library-internal: portable pseudo-random draws (the standard distributions are not portable).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

namespace attnscope::detail {

/// Standard normal numbers from std::mt19937_64 through Box-Muller; both values of each pair are
/// used, in order (cos first). Identical on every platform with an IEEE libm.
class NormalDraws {
 public:
  explicit NormalDraws(std::uint64_t seed) : gen_(seed) {}
  double next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    constexpr double kTwoPi = 6.283185307179586476925286766559;
    const double u1 = open_unit();
    const double u2 = open_unit();
    const double radius = std::sqrt(-2.0 * std::log(u1));
    spare_ = radius * std::sin(kTwoPi * u2);
    has_spare_ = true;
    return radius * std::cos(kTwoPi * u2);
  }

 private:
  /// Uniform in (0, 1]: the top 53 bits plus one, so log() never sees 0.
  double open_unit() { return static_cast<double>((gen_() >> 11) + 1) * 0x1.0p-53; }

  std::mt19937_64 gen_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

/// Uniform integer in [0, bound) by rejection (no modulo bias, portable unlike
/// std::uniform_int_distribution). Precondition: bound > 0.
inline std::uint64_t uniform_below(std::mt19937_64& gen, std::uint64_t bound) {
  const std::uint64_t limit = std::numeric_limits<std::uint64_t>::max() -
                              std::numeric_limits<std::uint64_t>::max() % bound;
  std::uint64_t x = gen();
  while (x >= limit) x = gen();
  return x % bound;
}

}  // namespace attnscope::detail
