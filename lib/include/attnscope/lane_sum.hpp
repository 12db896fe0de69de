// Sums in double over kLanes independent partial sums (combined at the end): the compiler widens
// and accumulates whole vectors at a time, where one running sum would serialise every addition.
// The order of a double sum of at most a few thousand terms moves it by far less than the margins
// of the searches that use it.
#pragma once

#include <Eigen/Core>

#include <array>
#include <cstddef>

namespace attnscope {

inline constexpr int kLanes = 16;

/// sum_{t < n} term(t) in double, kLanes partial sums at a time.
template <typename Term>
double lane_sum(Eigen::Index n, Term term) {
  std::array<double, kLanes> acc{};
  Eigen::Index t = 0;
  for (; t + kLanes <= n; t += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[static_cast<std::size_t>(l)] += term(t + l);
  }
  double s = 0.0;
  for (; t < n; ++t) s += term(t);
  for (const double a : acc) s += a;
  return s;
}

}  // namespace attnscope
