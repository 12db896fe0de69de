// Library-internal: portable pseudo-random draws (the standard distributions are not portable).
#pragma once

#include "attnscope/portable_math.hpp"
#include "attnscope/seed.hpp"  // detail::uniform_below

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

namespace attnscope::detail {

/// Standard normal numbers from std::mt19937_64 through Marsaglia's polar method
/// (portable::polar_normal_pair); both values of each pair are used, in order. The same numbers
/// on every CPU: no libm function (glibc's log, sin and cos round differently with and without
/// FMA), only portable::log and IEEE arithmetic.
class NormalDraws {
 public:
  explicit NormalDraws(std::uint64_t seed) : gen_(seed) {}
  double next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double a = 0.0;
    while (!portable::polar_normal_pair(2.0 * open_unit() - 1.0, 2.0 * open_unit() - 1.0, a, spare_)) {
    }
    has_spare_ = true;
    return a;
  }

 private:
  /// Uniform in (0, 1]: the top 53 bits plus one.
  double open_unit() { return static_cast<double>((gen_() >> 11) + 1) * 0x1.0p-53; }

  std::mt19937_64 gen_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace attnscope::detail
