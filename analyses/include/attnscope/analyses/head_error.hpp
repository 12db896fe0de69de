// Numerical errors that name the head they happened in.
#pragma once

#include "attnscope/error.hpp"

#include <string>
#include <utility>

namespace attnscope::analyses {

/// Runs fn() and returns its result; a NumericalError thrown inside is rethrown with
/// "image I, layer L, head H: " in front (image < 0 leaves the image out), so that the one line
/// on stderr says where the values went out of range.
template <typename Fn>
decltype(auto) in_head(int image, int layer, int head, Fn&& fn) {
  try {
    return std::forward<Fn>(fn)();
  } catch (const NumericalError& e) {
    std::string where = image >= 0 ? "image " + std::to_string(image) + ", " : std::string();
    where += "layer " + std::to_string(layer) + ", head " + std::to_string(head) + ": ";
    throw NumericalError(where + e.what());
  }
}

}  // namespace attnscope::analyses
