// Result sets (run/include/attnscope/run/result_set.hpp): staging, publishing with a manifest written last, write errors
// reported with the system's reason, stale staging folders, and the SHA-256 of the manifest.
#include "scratch_dir.hpp"
#include "attnscope/run/hash_tree.hpp"
#include "attnscope/run/result_set.hpp"
#include "attnscope/run/sha256.hpp"

#include "attnscope/error.hpp"
#include "attnscope/input_files.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>

namespace fs = std::filesystem;
using attnscope::run::ResultFile;
using attnscope::run::ResultSet;
using attnscope::run::Sha256;

namespace {

std::string sha(const std::string& s) {
  Sha256 h;
  h.update(s.data(), s.size());
  return h.hex_digest();
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::json read_json(const fs::path& p) { return nlohmann::json::parse(slurp(p)); }

std::set<std::string> entries(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

class ResultSetTest : public attnscope::test::ScratchDirTest {
 protected:
  /// Publishes files {name: content} with a record {"run": run}.
  void publish(const std::vector<std::pair<std::string, std::string>>& files, int run) {
    ResultSet set(dir_, "x.json");
    for (const auto& [name, content] : files) {
      ResultFile f(set, name);
      f.stream() << content;
      f.close();
    }
    set.publish({{"run", run}});
  }
};

}  // namespace

TEST(Sha256, MatchesTheFips180Examples) {
  EXPECT_EQ(sha(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

// Lengths around the block and padding boundaries, fed whole and byte by byte, and a long input
// fed in pieces of changing sizes, give the digest of the whole input at once.
TEST(Sha256, PiecesEqualTheWhole) {
  std::mt19937 rng(7);
  for (std::size_t len : {0, 1, 55, 56, 63, 64, 65, 119, 120, 127, 128, 129, 1000}) {
    std::string data(len, '\0');
    for (char& c : data) c = static_cast<char>(rng());
    Sha256 bytes;
    for (char c : data) bytes.update(&c, 1);
    EXPECT_EQ(bytes.hex_digest(), sha(data)) << "length " << len << ", seed 7";
  }
  std::string big(3 << 20, '\0');
  for (char& c : big) c = static_cast<char>(rng());
  Sha256 pieces;
  for (std::size_t at = 0, piece = 1; at < big.size(); at += piece, piece = piece * 5 % 100003 + 1) {
    pieces.update(big.data() + at, std::min(piece, big.size() - at));
  }
  EXPECT_EQ(pieces.hex_digest(), sha(big)) << "3 MiB fed in pieces";
}

TEST(Sha256, FeedingInPiecesGivesTheSameDigest) {
  // One million 'a' (FIPS 180-2 appendix B.3), fed in pieces of awkward sizes.
  const std::string chunk(997, 'a');
  Sha256 h;
  std::size_t left = 1000000;
  std::size_t piece = 1;
  while (left > 0) {
    const std::size_t n = std::min({piece, left, chunk.size()});
    h.update(chunk.data(), n);
    left -= n;
    piece = piece * 3 + 1;
  }
  EXPECT_EQ(h.hex_digest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

using HashTreeTest = attnscope::test::ScratchDirTest;

// The input fingerprint's tree (hash_tree_file), with each hash: a file of two whole 64 MiB chunks
// and a short one, hashed by 1, 2, 3 and 8 threads, gives the hash of its chunks' digests taken
// one after the other here; the small cases against values from Python's hashlib and xxhash
// (python3-xxhash): hashlib.sha256(hashlib.sha256(b"abc").digest()).hexdigest(),
// xxhash.xxh3_128(xxhash.xxh3_128(b"abc").digest()).hexdigest(), and each of b"" for the empty
// file.
TEST_F(HashTreeTest, ChunksHashedByAnyNumberOfThreadsGiveTheHashOfTheirDigests) {
  using attnscope::run::hash_tree_file;
  using attnscope::run::TreeHash;
  const fs::path small = dir_ / "abc", empty = dir_ / "empty", big = dir_ / "big";
  std::ofstream(small, std::ios::binary) << "abc";
  std::ofstream(empty, std::ios::binary).close();
  std::uintmax_t bytes = 99;
  EXPECT_EQ(hash_tree_file(small, TreeHash::sha256, 4, &bytes),
            "4f8b42c22dd3729b519ba6f68d2da7cc5b2d606d05daed5ad5128cc03e6c6358");
  EXPECT_EQ(bytes, 3U);
  EXPECT_EQ(hash_tree_file(small, TreeHash::xxh3_128, 4, &bytes), "f758394eebabb2bb51ee911f78f31836");
  EXPECT_EQ(hash_tree_file(empty, TreeHash::sha256, 2, &bytes),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(bytes, 0U);
  EXPECT_EQ(hash_tree_file(empty, TreeHash::xxh3_128, 2, &bytes), "99aa06d3014798d86001c324468d497f");
  EXPECT_EQ(bytes, 0U);

  const std::uintmax_t chunk = attnscope::run::kTreeChunkBytes;
  std::string data(2 * chunk + 12345, '\0');
  std::mt19937_64 rng(11);
  for (std::size_t i = 0; i + 8 <= data.size(); i += 8) {
    const std::uint64_t r = rng();
    std::memcpy(&data[i], &r, 8);
  }
  std::ofstream(big, std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
  // The SHA-256 tree from Sha256 objects; the XXH3-128 tree from libxxhash's one-shot calls, the
  // digests in canonical order.
  Sha256 top;
  std::string xxh_digests;
  for (std::uintmax_t at = 0; at < data.size(); at += chunk) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uintmax_t>(chunk, data.size() - at));
    Sha256 piece;
    piece.update(data.data() + at, n);
    const auto d = piece.digest();
    top.update(d.data(), d.size());
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(data.data() + at, n));
    xxh_digests.append(reinterpret_cast<const char*>(c.digest), sizeof(c.digest));
  }
  const std::string want_sha = top.hex_digest();
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(xxh_digests.data(), xxh_digests.size()));
  const std::string want_xxh = attnscope::run::to_hex(c.digest, sizeof(c.digest));
  for (int threads : {1, 2, 3, 8}) {
    EXPECT_EQ(hash_tree_file(big, TreeHash::sha256, threads, &bytes), want_sha) << threads << " threads";
    EXPECT_EQ(bytes, data.size());
    EXPECT_EQ(hash_tree_file(big, TreeHash::xxh3_128, threads, &bytes), want_xxh) << threads << " threads";
    EXPECT_EQ(bytes, data.size());
  }
  // One bit flipped in the middle chunk changes both trees.
  data[chunk + chunk / 2] ^= 1;
  std::ofstream(big, std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
  EXPECT_NE(hash_tree_file(big, TreeHash::sha256, 2, &bytes), want_sha);
  EXPECT_NE(hash_tree_file(big, TreeHash::xxh3_128, 2, &bytes), want_xxh);
}

TEST_F(HashTreeTest, AMissingFileIsAnErrorNamingIt) {
  for (const auto hash : {attnscope::run::TreeHash::sha256, attnscope::run::TreeHash::xxh3_128}) {
    try {
      attnscope::run::hash_tree_file(dir_ / "absent.h5", hash, 2);
      FAIL() << "no error";
    } catch (const attnscope::Error& e) {
      EXPECT_NE(std::string(e.what()).find("absent.h5: cannot read"), std::string::npos) << e.what();
    }
  }
}

// A file that ends before the size it had when opened (truncated while hashed) is an error naming
// it, not the hash of what was there. sysfs attributes do that every time: they report 4096 bytes
// and hold a few, so the path of a file cut short is taken deterministically.
TEST_F(HashTreeTest, AFileShorterThanWhenOpenedIsAnErrorNamingIt) {
  const fs::path attr = "/sys/devices/system/cpu/online";
  std::error_code ec;
  if (fs::file_size(attr, ec) != 4096 || ec) GTEST_SKIP() << attr << " is not a 4096-byte sysfs attribute here";
  for (const auto hash : {attnscope::run::TreeHash::sha256, attnscope::run::TreeHash::xxh3_128}) {
    try {
      attnscope::run::hash_tree_file(attr, hash, 2);
      FAIL() << "no error";
    } catch (const attnscope::Error& e) {
      EXPECT_NE(std::string(e.what()).find(attr.string() + ": became shorter while it was read (4096 bytes when opened"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST_F(ResultSetTest, PublishesEveryFileAndAManifestListingThem) {
  publish({{"a.csv", "x,y\n1,2\n"}, {"b.csv", "z\n"}}, 1);
  EXPECT_EQ(entries(dir_), (std::set<std::string>{"a.csv", "b.csv", "x.json"}))
      << "the staging folder must be gone";
  const nlohmann::json m = read_json(dir_ / "x.json");
  EXPECT_EQ(m["run"], 1);
  EXPECT_EQ(m["manifest_format"], 1);
  ASSERT_EQ(m["files"].size(), 2U);
  EXPECT_EQ(m["files"][0]["name"], "a.csv");
  EXPECT_EQ(m["files"][0]["bytes"], 8);
  EXPECT_EQ(m["files"][0]["sha256"], sha("x,y\n1,2\n"));
  EXPECT_EQ(m["files"][1]["name"], "b.csv");
  EXPECT_EQ(m["files"][1]["sha256"], attnscope::run::sha256_file(dir_ / "b.csv"));
  EXPECT_EQ(slurp(dir_ / "a.csv"), "x,y\n1,2\n");
}

TEST_F(ResultSetTest, ANewSetReplacesTheOldAndRemovesFilesItLacks) {
  publish({{"a.csv", "old a\n"}, {"gone.csv", "old\n"}}, 1);
  std::ofstream(dir_ / "unrelated.txt") << "not a result\n";
  publish({{"a.csv", "new a\n"}}, 2);
  EXPECT_EQ(entries(dir_), (std::set<std::string>{"a.csv", "unrelated.txt", "x.json"}));
  EXPECT_EQ(slurp(dir_ / "a.csv"), "new a\n");
  EXPECT_EQ(read_json(dir_ / "x.json")["run"], 2);
}

TEST_F(ResultSetTest, AnUnpublishedSetLeavesTheOldOneUntouched) {
  publish({{"a.csv", "old a\n"}}, 1);
  const std::string before = slurp(dir_ / "x.json");
  {
    ResultSet set(dir_, "x.json");
    ResultFile f(set, "a.csv");
    f.stream() << "new a\n";
    f.close();
    EXPECT_TRUE(fs::is_directory(set.staging()));
  }  // destroyed without publish(), as when a command fails
  EXPECT_EQ(entries(dir_), (std::set<std::string>{"a.csv", "x.json"}));
  EXPECT_EQ(slurp(dir_ / "a.csv"), "old a\n");
  EXPECT_EQ(slurp(dir_ / "x.json"), before);
}

TEST_F(ResultSetTest, AWriteErrorNamesTheFinalPathAndTheReason) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this system";
  ResultSet set(dir_, "x.json");
  // The staged file is /dev/full, where every write fails with ENOSPC.
  fs::create_symlink("/dev/full", set.stage("a.csv"));
  ResultFile f(set, "a.csv");
  f.stream() << std::string(200000, 'x');  // more than the buffer: the failure happens here
  f.stream() << "more";
  try {
    f.close();
    FAIL() << "close() succeeded on /dev/full";
  } catch (const attnscope::Error& e) {
    EXPECT_EQ(std::string(e.what()), (dir_ / "a.csv").string() + ": cannot write: No space left on device");
  }
}

TEST_F(ResultSetTest, AFileNeverWrittenStopsThePublish) {
  publish({{"a.csv", "old\n"}}, 1);
  ResultSet set(dir_, "x.json");
  (void)set.stage("a.csv");
  EXPECT_THROW(set.publish({{"run", 2}}), attnscope::Error);
  EXPECT_EQ(read_json(dir_ / "x.json")["run"], 1);
}

TEST_F(ResultSetTest, NamesMustBePlainFileNames) {
  ResultSet set(dir_, "x.json");
  EXPECT_THROW((void)set.stage("../a.csv"), attnscope::Error);
  EXPECT_THROW((void)set.stage("x.json"), attnscope::Error);
  EXPECT_THROW((void)set.stage(""), attnscope::Error);
  EXPECT_THROW(ResultSet(dir_, "sub/x.json"), attnscope::Error);
}

TEST_F(ResultSetTest, StagingFoldersOfDeadProcessesAreRemoved) {
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  // pid_max is at most 2^22 on Linux: this process cannot exist.
  const fs::path dead = dir_ / (".attnscope-tmp-99999999-abc-" + std::string(host));
  const fs::path alive = dir_ / (".attnscope-tmp-" + std::to_string(::getpid()) + "-abc-" + host);
  const fs::path other_host = dir_ / ".attnscope-tmp-99999999-abc-some-other-host.example";
  for (const auto& p : {dead, alive, other_host}) {
    fs::create_directories(p);
    std::ofstream(p / "f.csv") << "x\n";
  }
  { ResultSet set(dir_, "x.json"); }
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(alive));
  EXPECT_TRUE(fs::exists(other_host)) << "another machine's run may still be writing";
}

TEST_F(ResultSetTest, ErrorsNameTheResultsFolderNotTheStagingFolder) {
  ResultSet set(dir_, "x.json");
  const std::string staged = set.stage("d.h5").string();
  try {
    try {
      throw attnscope::InputError(staged, "/layers/0/q", "room", "none");
    } catch (...) {
      set.rethrow_with_final_names();
    }
  } catch (const attnscope::Error& e) {
    EXPECT_EQ(std::string(e.what()), (dir_ / "d.h5").string() + ": /layers/0/q: expected room, found none");
  }
  try {
    try {
      throw attnscope::UsageError("bad " + staged);
    } catch (...) {
      set.rethrow_with_final_names();
    }
  } catch (const attnscope::UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "bad " + (dir_ / "d.h5").string());
  }
}

// A result never replaces an input of the run (input_files.hpp), under its own name or another
// (a hard link), nor a file another process holds open for writing; other files are replaced.
TEST_F(ResultSetTest, NeverReplacesAnInputOrAFileAWriterHolds) {
  std::ofstream(dir_ / "in.h5") << "the dump\n";
  std::ofstream(dir_ / "other.h5") << "not read\n";
  fs::create_hard_link(dir_ / "in.h5", dir_ / "link.h5");
  attnscope::note_input_file(dir_ / "in.h5");
  EXPECT_TRUE(attnscope::is_input_file(dir_ / "link.h5"));
  EXPECT_FALSE(attnscope::is_input_file(dir_ / "other.h5"));
  for (const char* name : {"in.h5", "link.h5"}) {
    try {
      attnscope::run::check_result_path(dir_ / name);
      ADD_FAILURE() << name << " was not refused";
    } catch (const attnscope::InputError& e) {
      EXPECT_NE(std::string(e.what()).find("not an input of the run"), std::string::npos) << e.what();
    }
    ResultSet set(dir_, "x.json");
    EXPECT_THROW((void)set.stage(name), attnscope::InputError) << name;
  }
  EXPECT_EQ(slurp(dir_ / "in.h5"), "the dump\n");
  publish({{"other.h5", "a result\n"}}, 1);  // the negative control: replaced
  EXPECT_EQ(slurp(dir_ / "other.h5"), "a result\n");

  // A writer's exclusive lock, taken by a child process that holds it until told to stop.
  std::ofstream(dir_ / "held.h5") << "being written\n";
  int ready[2], stop[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(stop), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const int fd = ::open((dir_ / "held.h5").c_str(), O_RDWR);
    const bool locked = fd >= 0 && ::flock(fd, LOCK_EX) == 0;
    char c = locked ? 'y' : 'n';
    (void)!::write(ready[1], &c, 1);
    (void)!::read(stop[0], &c, 1);
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  EXPECT_THROW(attnscope::run::check_result_path(dir_ / "held.h5"), attnscope::InputError);
  (void)!::write(stop[1], &c, 1);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_NO_THROW(attnscope::run::check_result_path(dir_ / "held.h5"));  // the writer is gone
  for (int fd : {ready[0], ready[1], stop[0], stop[1]}) ::close(fd);
}
