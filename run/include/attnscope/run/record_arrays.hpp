// Numeric arrays in an image run's records, stored as CBOR byte strings holding the values' own
// bytes (little-endian binary64 or int64), not as one JSON number each: a `sinks` record of
// 36 heads x 197 keys costs one copy instead of 7,092 JSON nodes built, encoded, parsed and
// freed (docs/benchmarks.md, "Records as byte strings"). Exact both ways, NaN payloads and
// signed zeros included. The readers also take the plain arrays of numbers that records held
// before, so journals and shard files written by an earlier build still resume and merge.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace attnscope::run {

/// The values as one CBOR byte string (nlohmann's binary type, no subtype).
nlohmann::json packed_array(std::span<const double> values);
nlohmann::json packed_array(std::span<const std::int64_t> values);

/// The values of a packed_array, or of a plain array of numbers. Throws Error naming `what` on
/// anything else: another type, a byte string whose length is not a whole number of values, an
/// array holding a value that is not a number of the type.
std::vector<double> unpacked_doubles(const nlohmann::json& j, const std::string& what);
std::vector<std::int64_t> unpacked_int64s(const nlohmann::json& j, const std::string& what);

/// Rows of values: an array of packed_array, one per row, and back.
template <typename T>
nlohmann::json packed_rows(const std::vector<std::vector<T>>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : rows) out.push_back(packed_array(std::span<const T>(r)));
  return out;
}
std::vector<std::vector<double>> unpacked_double_rows(const nlohmann::json& j, const std::string& what);
std::vector<std::vector<std::int64_t>> unpacked_int64_rows(const nlohmann::json& j, const std::string& what);

}  // namespace attnscope::run
