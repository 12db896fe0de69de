// Seeds of independent random streams derived from one user seed and a few indices (image, layer,
// head, ...): nearby inputs give unrelated streams, and every platform derives the same numbers.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <random>

namespace attnscope {

/// The splitmix64 finaliser of h combined with v.
[[nodiscard]] inline std::uint64_t mix_seed(std::uint64_t h, std::uint64_t v) {
  std::uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// mix_seed folded over the indices, in order.
[[nodiscard]] inline std::uint64_t mix_seed(std::uint64_t seed, std::initializer_list<std::uint64_t> indices) {
  for (const std::uint64_t i : indices) seed = mix_seed(seed, i);
  return seed;
}

namespace detail {

/// Uniform integer in [0, bound) by rejection (no modulo bias, portable unlike
/// std::uniform_int_distribution). Precondition: bound > 0.
inline std::uint64_t uniform_below(std::mt19937_64& gen, std::uint64_t bound) {
  const std::uint64_t limit =
      std::numeric_limits<std::uint64_t>::max() - std::numeric_limits<std::uint64_t>::max() % bound;
  std::uint64_t x = gen();
  while (x >= limit) x = gen();
  return x % bound;
}

}  // namespace detail

}  // namespace attnscope
