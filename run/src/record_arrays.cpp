#include "attnscope/run/record_arrays.hpp"

#include "attnscope/error.hpp"

#include <bit>
#include <cstring>
#include <type_traits>

namespace attnscope::run {

static_assert(std::endian::native == std::endian::little, "records store little-endian values");

namespace {

template <typename T>
nlohmann::json pack(std::span<const T> values) {
  std::vector<std::uint8_t> bytes(values.size_bytes());
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), values.size_bytes());
  return nlohmann::json::binary(std::move(bytes));
}

template <typename T>
std::vector<T> unpack(const nlohmann::json& j, const std::string& what) {
  if (j.is_binary()) {
    const auto& bytes = j.get_binary();
    if (bytes.size() % sizeof(T) != 0) throw Error(what + ": a malformed record (a cut array)");
    std::vector<T> out(bytes.size() / sizeof(T));
    if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }
  if (!j.is_array()) throw Error(what + ": a malformed record (not an array)");
  std::vector<T> out;
  out.reserve(j.size());
  for (const auto& v : j) {
    const bool fits = std::is_floating_point_v<T> ? v.is_number() : v.is_number_integer();
    if (!fits) throw Error(what + ": a malformed record (not a number)");
    out.push_back(v.get<T>());
  }
  return out;
}

template <typename T>
std::vector<std::vector<T>> unpack_rows(const nlohmann::json& j, const std::string& what) {
  if (!j.is_array()) throw Error(what + ": a malformed record (not an array of rows)");
  std::vector<std::vector<T>> out;
  out.reserve(j.size());
  for (const auto& r : j) out.push_back(unpack<T>(r, what));
  return out;
}

}  // namespace

nlohmann::json packed_array(std::span<const double> values) { return pack(values); }
nlohmann::json packed_array(std::span<const std::int64_t> values) { return pack(values); }

std::vector<double> unpacked_doubles(const nlohmann::json& j, const std::string& what) {
  return unpack<double>(j, what);
}
std::vector<std::int64_t> unpacked_int64s(const nlohmann::json& j, const std::string& what) {
  return unpack<std::int64_t>(j, what);
}
std::vector<std::vector<double>> unpacked_double_rows(const nlohmann::json& j, const std::string& what) {
  return unpack_rows<double>(j, what);
}
std::vector<std::vector<std::int64_t>> unpacked_int64_rows(const nlohmann::json& j, const std::string& what) {
  return unpack_rows<std::int64_t>(j, what);
}

}  // namespace attnscope::run
