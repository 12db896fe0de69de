// Sums in double over kLanes independent partial sums, combined at the end as a tree (four
// levels of additions, where adding them one after another was a chain of kLanes): the compiler
// widens and accumulates whole vectors at a time, where one running sum would serialise every
// addition. The order is fixed, so the same terms give the same bits on every CPU.
// The order of a double sum of at most a few thousand terms moves it by far less than the margins
// of the searches that use it.
#pragma once

#include <Eigen/Core>

#include <array>
#include <cstddef>

namespace attnscope {

inline constexpr int kLanes = 16;

/// The lanes' tree: lane l takes lane l + h for h = width / 2, ..., 2, 1 (width a power of two,
/// kLanes for the whole tree); lane 0 then holds the lanes' sum. The vector forms
/// (portable_math.cpp's lanes_of_rows) take the levels that span whole vectors themselves and
/// then these, over the last vector's lanes: the same additions in the same order.
template <typename T>
T lane_tree(T* lanes, std::size_t width = kLanes) {
  for (std::size_t h = width / 2; h >= 1; h /= 2) {
    for (std::size_t l = 0; l < h; ++l) lanes[l] += lanes[l + h];
  }
  return lanes[0];
}

/// sum_{t < n} term(t) in double: lane l sums the terms t = l mod kLanes of the whole groups of
/// kLanes in increasing t; the rest, t past the last whole group, is summed from 0 in order; the
/// result is that rest plus the lanes' tree (lane_tree).
template <typename Term>
double lane_sum(Eigen::Index n, Term term) {
  std::array<double, kLanes> acc{};
  Eigen::Index t = 0;
  for (; t + kLanes <= n; t += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[static_cast<std::size_t>(l)] += term(t + l);
  }
  double s = 0.0;
  for (; t < n; ++t) s += term(t);
  return s + lane_tree(acc.data());
}

}  // namespace attnscope
