// Seeded test inputs: Q/K/V matrices, masks and the awkward sizes every comparison runs on.
// Deterministic on every platform (own Box-Muller over std::mt19937_64).
#pragma once

#include "attnscope/attention.hpp"
#include "attnscope/layout.hpp"

#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>

namespace attnscope::test {

inline constexpr std::array<int, 4> kAwkwardN{1, 2, 50, 197};
inline constexpr std::array<int, 3> kAwkwardD{1, 7, 64};

/// Standard normal draws: mt19937_64 + Box-Muller.
class Normal {
 public:
  explicit Normal(std::uint64_t seed) : gen_(seed) {}
  double operator()() {
    const double u1 = static_cast<double>((gen_() >> 11) + 1) * 0x1.0p-53;
    const double u2 = static_cast<double>(gen_() >> 11) * 0x1.0p-53;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  std::mt19937_64& engine() { return gen_; }

 private:
  std::mt19937_64 gen_;
};

/// rows x cols entries drawn N(mean, sd^2).
inline MatD random_matrix(Eigen::Index rows, Eigen::Index cols, std::uint64_t seed,
                          double mean = 0.0, double sd = 1.0) {
  Normal normal(seed);
  MatD m(rows, cols);
  for (Eigen::Index i = 0; i < rows; ++i) {
    for (Eigen::Index j = 0; j < cols; ++j) m(i, j) = mean + sd * normal();
  }
  return m;
}

struct Qkv {
  MatD q, k, v;
};

/// Q, K (n x d) and V (n x dv) from one seed; `mean` shifts Q and K (not V).
inline Qkv random_qkv(int n, int d, int dv, std::uint64_t seed, double mean = 0.0) {
  return {random_matrix(n, d, seed * 3 + 1, mean), random_matrix(n, d, seed * 3 + 2, mean),
          random_matrix(n, dv, seed * 3 + 3)};
}

/// Each entry kept with probability `keep`; `empty_rows` rows (the first ones) keep nothing.
inline Mask random_mask(Eigen::Index rows, Eigen::Index cols, double keep, std::uint64_t seed,
                        Eigen::Index empty_rows = 0) {
  std::mt19937_64 gen(seed);
  Mask m(rows, cols);
  for (Eigen::Index i = 0; i < rows; ++i) {
    for (Eigen::Index j = 0; j < cols; ++j) {
      m(i, j) = i >= empty_rows && static_cast<double>(gen() >> 11) * 0x1.0p-53 < keep;
    }
  }
  return m;
}

/// The input rounded to T and back, so that a double reference sees exactly what T saw.
template <typename T>
Mat<T> as(const MatD& m) {
  return m.cast<T>();
}
template <typename T>
MatD rounded(const MatD& m) {
  return m.cast<T>().template cast<double>();
}

template <typename T>
std::string precision_name() {
  return sizeof(T) == sizeof(double) ? "double" : "float";
}

/// Configuration text for assertion messages.
inline std::string config(const std::string& what, int n, int d, std::uint64_t seed,
                          const std::string& precision) {
  return what + " N=" + std::to_string(n) + " d=" + std::to_string(d) +
         " seed=" + std::to_string(seed) + " " + precision;
}

}  // namespace attnscope::test
