// Named tolerances of the unit tests. Errors are measured against a scale of max(1, max |ref|)
// (see compare.hpp), so one number serves weights in [0, 1] and the larger InLine/MALA entries.
#pragma once

namespace attnscope::test {

/// Fast double path vs the plain-loop double reference: a few ulps times the sum length.
inline constexpr double kDoubleTol = 1e-12;
/// Float path vs the double reference on the same (float-rounded) inputs: the library computes
/// in double and rounds once at the end.
inline constexpr double kFloatTol = 1e-6;
/// |sum_j w_ij - 1| relative to max(1, sum_j |w_ij|).
inline constexpr double kRowSumDoubleTol = 1e-12;
inline constexpr double kRowSumFloatTol = 1e-6;

template <typename T>
constexpr double tolerance() {
  return sizeof(T) == sizeof(double) ? kDoubleTol : kFloatTol;
}
template <typename T>
constexpr double row_sum_tolerance() {
  return sizeof(T) == sizeof(double) ? kRowSumDoubleTol : kRowSumFloatTol;
}

}  // namespace attnscope::test
