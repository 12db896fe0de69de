// The journal of image runs: records come back exactly (doubles bit for bit), a torn tail is
// dropped, corruption is named, a different run's journal is refused, and one writer at a time.
#include "attnscope/run/journal.hpp"
#include "attnscope/run/hash_tree.hpp"

#include "attnscope/error.hpp"
#include "scratch_dir.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>

namespace attnscope::run {
namespace {

using nlohmann::json;
using test::ScratchDirTest;

class JournalTest : public ScratchDirTest {
 protected:
  std::vector<json> read_back(const std::string& p, json* header = nullptr) {
    std::vector<json> out;
    read_journal(p, [&](const json& h) { if (header) *header = h; },
                 [&](json&& r) { out.push_back(std::move(r)); });
    return out;
  }
  static std::uintmax_t size_of(const std::string& p) { return std::filesystem::file_size(p); }
};

json awkward_doubles() {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-1, 1);
  json a = json::array();
  for (double x : {0.1, 1.0 / 3.0, -0.0, 5e-324, 2.2250738585072014e-308,
                   std::numeric_limits<double>::max(), 1e-300, 123456789.123456789}) {
    a.push_back(x);
  }
  for (int i = 0; i < 100; ++i) a.push_back(u(rng) * std::pow(10.0, (i % 40) - 20));
  return a;
}

TEST_F(JournalTest, RecordsComeBackBitForBit) {
  const std::string p = path("j");
  const json header = {{"run", {{"command", "x"}}}};
  const json doubles = awkward_doubles();
  {
    JournalWriter w(p, header, false, [](json&&) {});
    for (int i = 0; i < 5; ++i) w.append({{"image", i}, {"record", doubles}});
  }
  json h;
  const std::vector<json> back = read_back(p, &h);
  EXPECT_EQ(h, header);
  EXPECT_EQ(read_journal_header(p), header);
  std::ofstream(path("not")) << "not a journal at all\n";
  EXPECT_THROW((void)read_journal_header(path("not")), InputError);
  ASSERT_EQ(back.size(), 5u);
  for (const json& r : back) {
    const auto got = r["record"].get<std::vector<double>>();
    const auto want = doubles.get<std::vector<double>>();
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t k = 0; k < got.size(); ++k) {
      EXPECT_EQ(std::memcmp(&got[k], &want[k], sizeof(double)), 0) << k << ": " << want[k];
    }
  }
}

TEST_F(JournalTest, ResumeKeepsRecordsAndCutsATornTail) {
  const std::string p = path("j");
  const json header = {{"run", 1}};
  {
    JournalWriter w(p, header, false, [](json&&) {});
    for (int i = 0; i < 4; ++i) w.append({{"image", i}});
  }
  const std::uintmax_t whole = size_of(p);
  // Every possible cut inside the last frame: three records survive, the rest is cut off.
  for (std::uintmax_t cut = 1; cut < 12; ++cut) {
    std::filesystem::copy_file(p, path("cut"), std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(path("cut"), whole - cut);
    std::vector<int> seen;
    {
      JournalWriter w(path("cut"), header, true, [&](json&& r) { seen.push_back(r["image"]); });
      EXPECT_FALSE(w.discarded_previous());
      w.append({{"image", 99}});
    }
    EXPECT_EQ(seen, (std::vector<int>{0, 1, 2})) << "cut " << cut;
    const std::vector<json> back = read_back(path("cut"));
    ASSERT_EQ(back.size(), 4u) << "cut " << cut;
    EXPECT_EQ(back.back()["image"], 99);
  }
  // A complete journal read as a finished one: a torn tail is an error there.
  std::filesystem::resize_file(p, whole - 2);
  EXPECT_THROW(read_back(p), InputError);
}

TEST_F(JournalTest, AJournalOfAnotherRunIsRefusedOnResumeAndReplacedWithout) {
  const std::string p = path("j");
  {
    JournalWriter w(p, {{"run", {{"eps", 0.001}}}, {"args", {"a"}}}, false, [](json&&) {});
    w.append({{"image", 0}});
  }
  try {
    JournalWriter w(p, {{"run", {{"eps", 0.01}}}, {"args", {"a"}}}, true, [](json&&) {});
    FAIL() << "a journal of another run was continued";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("run.eps: 0.01 here, 0.001 in the journal"),
              std::string::npos) << e.what();
  }
  // Other arguments (how the run was typed) do not make it another run.
  int seen = 0;
  { JournalWriter w(p, {{"run", {{"eps", 0.001}}}, {"args", {"b"}}}, true, [&](json&&) { ++seen; }); }
  EXPECT_EQ(seen, 1);
  // Without resume the old records are discarded, and the writer says so.
  {
    JournalWriter w(p, {{"run", {{"eps", 0.01}}}}, false, [&](json&&) { ++seen; });
    EXPECT_TRUE(w.discarded_previous());
  }
  EXPECT_EQ(seen, 1);
  EXPECT_TRUE(read_back(p).empty());
}

// A changed input is named as such; a journal whose inputs were fingerprinted another way (an
// older attnscope's plain SHA-256 or SHA-256 tree) is refused as that, not as a changed file.
TEST_F(JournalTest, AnInputFingerprintedAnotherWayIsNotCalledAChangedFile) {
  const auto header = [](const char* key, const char* sum) {
    return json{{"run", {{"fingerprint", {{"dumps", json::array({{{"bytes", 10}, {key, sum}}})}}}}}};
  };
  const std::string p = path("j");
  { JournalWriter w(p, header("sha256", "aa"), false, [](json&&) {}); }
  const auto refusal = [&](const json& h) {
    try {
      JournalWriter w(p, h, true, [](json&&) {});
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string older = refusal(header("sha256_tree_64mib", "aa"));
  EXPECT_NE(older.find("written by an attnscope that fingerprinted its inputs another way"), std::string::npos)
      << older;
  EXPECT_EQ(older.find("is not the one it was written for"), std::string::npos) << older;
  const std::string changed = refusal(header("sha256", "bb"));
  EXPECT_NE(changed.find("an input file (dump or weights) is not the one it was written for"), std::string::npos)
      << changed;
  // The SHA-256 tree of the attnscope before the XXH3-128 tree of today's.
  using attnscope::run::tree_hash_key;
  using attnscope::run::TreeHash;
  { JournalWriter w(p, header(tree_hash_key(TreeHash::sha256), "aa"), false, [](json&&) {}); }
  const std::string tree = refusal(header(tree_hash_key(TreeHash::xxh3_128), "aa"));
  EXPECT_NE(tree.find("written by an attnscope that fingerprinted its inputs another way"), std::string::npos)
      << tree;
}

TEST_F(JournalTest, CorruptionInsideIsNamedWithItsOffset) {
  const std::string p = path("j");
  {
    JournalWriter w(p, {{"run", 1}}, false, [](json&&) {});
    for (int i = 0; i < 3; ++i) w.append({{"image", i}, {"record", "some text to damage"}});
  }
  {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('#');
  }
  try {
    JournalWriter w(p, {{"run", 1}}, true, [](json&&) {});
    FAIL() << "a damaged journal was continued";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(p + " at byte"), std::string::npos) << e.what();
  }
  std::ofstream(path("other")) << "not a journal at all\n";
  EXPECT_THROW(JournalWriter(path("other"), {{"run", 1}}, true, [](json&&) {}), InputError);
}

TEST_F(JournalTest, OneWriterAtATime) {
  const std::string p = path("j");
  JournalWriter first(p, {{"run", 1}}, false, [](json&&) {});
  EXPECT_THROW(JournalWriter(p, {{"run", 1}}, true, [](json&&) {}), UsageError);
  first.remove();
  EXPECT_FALSE(std::filesystem::exists(p));
  JournalWriter second(p, {{"run", 1}}, true, [](json&&) {});
}

TEST_F(JournalTest, FramesParseAcrossChunkBoundaries) {
  std::vector<char> bytes;
  for (int i = 0; i < 10; ++i) append_frame(bytes, {{"image", i}});
  // Any prefix parses to the complete frames it holds and reports their length.
  for (std::size_t n = 0; n <= bytes.size(); ++n) {
    int count = 0;
    const std::size_t used = parse_frames(bytes.data(), n, "mem", 0, [&](json&& j) {
      EXPECT_EQ(j["image"], count);
      ++count;
    });
    EXPECT_LE(used, n);
    EXPECT_GT(used + 17, n);  // never leaves a whole frame unread (a frame here is < 17 bytes)
  }
}

}  // namespace
}  // namespace attnscope::run
