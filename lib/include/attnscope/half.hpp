// IEEE 754 binary16 ("float16", numpy.float16) widened to float, exactly.
//
// Every half value is a float value, so the widening never rounds: normal halves re-bias their
// exponent, subnormal halves (units of 2^-24) become normal floats, Inf stays Inf and NaN stays
// NaN with its payload shifted into the float mantissa. The dump reader reads float16 datasets as
// raw bits and widens them with this, which is much faster than HDF5's soft conversion.
#pragma once

#include <bit>
#include <cstdint>

namespace attnscope {

[[nodiscard]] inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000U) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fU;
  const std::uint32_t mantissa = h & 0x3ffU;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float m = static_cast<float>(mantissa) * 0x1p-24F;
    return sign != 0 ? -m : m;
  }
  // Float exponent bias 127 vs half bias 15: +112; all ones (Inf/NaN) maps to all ones.
  const std::uint32_t e = exponent == 0x1fU ? 0xffU : exponent + 112U;
  return std::bit_cast<float>(sign | (e << 23) | (mantissa << 13));
}

}  // namespace attnscope
