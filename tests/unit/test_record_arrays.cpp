// Numeric arrays in image-run records (run/record_arrays.hpp): byte strings that come back bit
// for bit through a journal's frames, the plain arrays of earlier records still read, and every
// malformed array named.
#include "attnscope/run/record_arrays.hpp"
#include "attnscope/run/journal.hpp"

#include "attnscope/error.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace attnscope::run {
namespace {

using nlohmann::json;

/// The record through one journal frame: encoded to CBOR and parsed back.
json through_frame(const json& record) {
  std::vector<char> bytes;
  append_frame(bytes, record);
  std::vector<json> back;
  const std::size_t used = parse_frames(bytes.data(), bytes.size(), "test", 0, [&](json&& r) { back.push_back(std::move(r)); });
  EXPECT_EQ(used, bytes.size());
  EXPECT_EQ(back.size(), 1U);
  return back.empty() ? json() : back.front();
}

std::vector<double> awkward_doubles() {
  const double nan_payload = std::bit_cast<double>(std::uint64_t{0xfff4000000000abcULL});  // a negative NaN, payload set
  std::vector<double> v = {0.1, -0.0, 0.0, 5e-324, -2.2250738585072014e-308, std::numeric_limits<double>::max(),
                           -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::quiet_NaN(), nan_payload, 1.0 / 3.0, 3.0};
  for (int i = 0; i < 197; ++i) v.push_back(std::ldexp(1.0 + i / 197.0, i - 98));  // 209: no multiple of a vector
  return v;
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

TEST(RecordArrays, DoublesAndIntegersComeBackBitForBitThroughAFrame) {
  const std::vector<double> d = awkward_doubles();
  const std::vector<std::int64_t> i = {0, -1, 1, std::numeric_limits<std::int64_t>::min(),
                                       std::numeric_limits<std::int64_t>::max(), 1LL << 53, -(1LL << 53) - 1};
  const json back = through_frame({{"d", packed_array(d)}, {"i", packed_array(i)}, {"none", packed_array(std::vector<double>{})}});
  ASSERT_TRUE(back.at("d").is_binary());
  EXPECT_EQ(back.at("d").get_binary().size(), d.size() * sizeof(double));
  EXPECT_TRUE(same_bits(unpacked_doubles(back.at("d"), "test"), d));
  EXPECT_EQ(unpacked_int64s(back.at("i"), "test"), i);
  EXPECT_TRUE(unpacked_doubles(back.at("none"), "test").empty());
}

TEST(RecordArrays, RowsOfEveryLengthComeBack) {
  const std::vector<std::vector<double>> d = {{}, {1.5}, awkward_doubles(), {-0.0, 2.0}};
  const std::vector<std::vector<std::int64_t>> i = {{3, 4, 5}, {}, {std::numeric_limits<std::int64_t>::min()}};
  const json back = through_frame({{"d", packed_rows(d)}, {"i", packed_rows(i)}});
  const auto d2 = unpacked_double_rows(back.at("d"), "test");
  ASSERT_EQ(d2.size(), d.size());
  for (std::size_t r = 0; r < d.size(); ++r) EXPECT_TRUE(same_bits(d2[r], d[r])) << "row " << r;
  EXPECT_EQ(unpacked_int64_rows(back.at("i"), "test"), i);
}

// Journals and shard files written before the byte strings hold arrays of numbers: still read,
// to the same values (CBOR keeps every double exact, integers as integers).
TEST(RecordArrays, PlainArraysOfEarlierRecordsAreRead) {
  std::vector<double> finite;
  for (double x : awkward_doubles()) {
    if (std::isfinite(x)) finite.push_back(x);
  }
  const std::vector<std::int64_t> i = {7, -7, std::numeric_limits<std::int64_t>::max()};
  const std::vector<std::vector<std::int64_t>> rows = {{1, 2}, {}, {3}};
  const json back = through_frame({{"d", finite}, {"whole", {1, 2, 3}}, {"i", i}, {"rows", rows}});
  EXPECT_TRUE(same_bits(unpacked_doubles(back.at("d"), "test"), finite));
  EXPECT_EQ(unpacked_doubles(back.at("whole"), "test"), (std::vector<double>{1.0, 2.0, 3.0}));
  EXPECT_EQ(unpacked_int64s(back.at("i"), "test"), i);
  EXPECT_EQ(unpacked_int64_rows(back.at("rows"), "test"), rows);
}

TEST(RecordArrays, MalformedArraysAreNamed) {
  const auto error_of = [](const auto& read) -> std::string {
    try {
      read();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  const json cut = json::binary(std::vector<std::uint8_t>(12, 0));  // one and a half values
  EXPECT_EQ(error_of([&] { unpacked_doubles(cut, "sinks: image 3"); }), "sinks: image 3: a malformed record (a cut array)");
  EXPECT_EQ(error_of([&] { unpacked_int64s(cut, "x"); }), "x: a malformed record (a cut array)");
  EXPECT_EQ(error_of([&] { unpacked_doubles(json("1.0"), "x"); }), "x: a malformed record (not an array)");
  EXPECT_EQ(error_of([&] { unpacked_doubles(json::object(), "x"); }), "x: a malformed record (not an array)");
  EXPECT_EQ(error_of([&] { unpacked_doubles(json::array({1.0, "two"}), "x"); }), "x: a malformed record (not a number)");
  EXPECT_EQ(error_of([&] { unpacked_int64s(json::array({1, 2.5}), "x"); }), "x: a malformed record (not a number)");
  EXPECT_EQ(error_of([&] { unpacked_int64_rows(json::array({json::array({1}), 2}), "x"); }),
            "x: a malformed record (not an array)");
  EXPECT_EQ(error_of([&] { unpacked_double_rows(cut, "x"); }), "x: a malformed record (not an array of rows)");
}

}  // namespace
}  // namespace attnscope::run
