#include "attnscope/run/journal.hpp"

#include "attnscope/error.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace attnscope::run {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[] = "attnscope journal 1\n";
constexpr std::size_t kMagicLen = sizeof kMagic - 1;
constexpr std::size_t kFrameHead = 8;
/// A frame longer than this is corruption, not a record.
constexpr std::uint32_t kMaxPayload = 1u << 30;

std::uint32_t fnv1a(const char* p, std::size_t n) {
  std::uint32_t h = 2166136261u;
  for (std::size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 16777619u;
  }
  return h;
}

void put_u32(std::vector<char>& out, std::uint32_t v) {
  for (int b = 0; b < 4; ++b) out.push_back(static_cast<char>((v >> (8 * b)) & 0xffu));
}

std::uint32_t get_u32(const char* p) {
  std::uint32_t v = 0;
  for (int b = 3; b >= 0; --b) v = (v << 8) | static_cast<unsigned char>(p[b]);
  return v;
}

[[noreturn]] void fail(const fs::path& p, const std::string& what, int err) {
  throw Error(p.string() + ": " + what + ": " + std::strerror(err));
}

void write_all(int fd, const char* p, std::size_t n, const fs::path& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(path, "cannot write the journal", errno);
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

/// Reads the whole journal at `fd`: checks the magic line, then parses frames. Returns the
/// offset after the last complete frame (0 when even the magic line is incomplete).
std::uint64_t scan(int fd, const fs::path& path, const std::function<void(nlohmann::json&&)>& fn) {
  std::vector<char> buf;
  std::vector<char> chunk(1 << 20);
  std::uint64_t consumed = 0;  // file offset of buf[0]
  bool magic_ok = false;
  for (;;) {
    const ssize_t r = ::read(fd, chunk.data(), chunk.size());
    if (r < 0) {
      if (errno == EINTR) continue;
      fail(path, "cannot read the journal", errno);
    }
    buf.insert(buf.end(), chunk.data(), chunk.data() + r);
    if (!magic_ok) {
      if (buf.size() < kMagicLen) {
        if (r == 0) return 0;
        continue;
      }
      if (std::memcmp(buf.data(), kMagic, kMagicLen) != 0) {
        throw InputError(path.string(), "journal", "a journal of attnscope (first line '" +
                                                       std::string(kMagic, kMagicLen - 1) + "')",
                         "another file");
      }
      magic_ok = true;
      buf.erase(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(kMagicLen));
      consumed = kMagicLen;
    }
    const std::size_t used = parse_frames(buf.data(), buf.size(), path.string(), consumed, fn);
    buf.erase(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(used));
    consumed += used;
    if (r == 0) return consumed;
  }
}

}  // namespace

void append_frame(std::vector<char>& out, const nlohmann::json& payload) {
  const std::vector<std::uint8_t> cbor = nlohmann::json::to_cbor(payload);
  const char* p = reinterpret_cast<const char*>(cbor.data());
  put_u32(out, static_cast<std::uint32_t>(cbor.size()));
  put_u32(out, fnv1a(p, cbor.size()));
  out.insert(out.end(), p, p + cbor.size());
}

std::size_t parse_frames(const char* bytes, std::size_t n, const std::string& what,
                         std::uint64_t offset,
                         const std::function<void(nlohmann::json&&)>& fn) {
  std::size_t at = 0;
  while (n - at >= kFrameHead) {
    const std::uint32_t len = get_u32(bytes + at);
    const std::uint32_t sum = get_u32(bytes + at + 4);
    if (len > kMaxPayload) {
      throw Error(what + " at byte " + std::to_string(offset + at) +
                  ": corrupt journal frame (length " + std::to_string(len) + ")");
    }
    if (n - at - kFrameHead < len) break;  // torn: the rest has not been written
    const char* p = bytes + at + kFrameHead;
    if (fnv1a(p, len) != sum) {
      // A complete frame with a wrong checksum is corruption, unless it is the file's last
      // frame, which a kill can leave half written over stale bytes; the caller sees the tail.
      if (n - at - kFrameHead == len) break;
      throw Error(what + " at byte " + std::to_string(offset + at) +
                  ": corrupt journal frame (checksum mismatch)");
    }
    nlohmann::json j = nlohmann::json::from_cbor(p, p + len, true, false);
    if (j.is_discarded()) {
      throw Error(what + " at byte " + std::to_string(offset + at) + ": unreadable journal frame");
    }
    fn(std::move(j));
    at += kFrameHead + len;
  }
  return at;
}

namespace {

/// Whether the two headers' input fingerprints name their files' hashes by other keys (a journal
/// of an attnscope from before the SHA-256 tree holds "sha256"): then their difference says
/// nothing about the files.
bool other_fingerprint_scheme(const nlohmann::json& mine, const nlohmann::json& theirs) {
  const auto dumps = [](const nlohmann::json& h) -> const nlohmann::json* {
    if (!h.is_object() || !h.contains("run") || !h["run"].is_object()) return nullptr;
    const nlohmann::json& run = h["run"];
    if (!run.contains("fingerprint") || !run["fingerprint"].is_object()) return nullptr;
    const nlohmann::json& f = run["fingerprint"];
    return f.contains("dumps") && f["dumps"].is_array() && !f["dumps"].empty() ? &f["dumps"] : nullptr;
  };
  const nlohmann::json* a = dumps(mine);
  const nlohmann::json* b = dumps(theirs);
  if (a == nullptr || b == nullptr || !(*a)[0].is_object() || !(*b)[0].is_object()) return false;
  for (const auto& [key, value] : (*a)[0].items()) {
    if (!(*b)[0].contains(key)) return true;
  }
  return false;
}

}  // namespace

JournalWriter::JournalWriter(fs::path path, const nlohmann::json& header, bool resume,
                             const std::function<void(nlohmann::json&&)>& seen)
    : path_(std::move(path)) {
  std::error_code ec;
  fs::create_directories(path_.parent_path(), ec);
  if (ec) fail(path_.parent_path(), "cannot create the folder of the run's journal", ec.value());
  // The journal is attnscope's own file: never written through a link onto another file.
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0 && errno == ELOOP) {
    throw InputError(path_.string(), "", "a journal of attnscope's own (a regular file)", "a symbolic link");
  }
  if (fd_ < 0) fail(path_, "cannot open the journal", errno);
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK) {
      throw UsageError(path_.string() + ": another attnscope run is writing this results folder");
    }
    fail(path_, "cannot lock the journal", err);
  }
  struct stat st{};
  if (::fstat(fd_, &st) != 0) fail(path_, "cannot stat the journal", errno);
  if (!S_ISREG(st.st_mode) || st.st_nlink != 1) {
    ::close(fd_);
    fd_ = -1;
    throw InputError(path_.string(), "", "a journal of attnscope's own (a regular file of one name)",
                     S_ISREG(st.st_mode) ? "a file with other names (hard links)" : "a special file");
  }
  std::uint64_t keep = 0;
  if (st.st_size > 0) {
    bool first = true;
    std::string mismatch;
    nlohmann::json journal_header;
    keep = scan(fd_, path_, [&](nlohmann::json&& j) {
      if (first) {
        first = false;
        // "args" is how the run was typed (--threads and all), not what it computes.
        nlohmann::json a = header, b = j;
        if (a.is_object()) a.erase("args");
        if (b.is_object()) b.erase("args");
        mismatch = header_difference(a, b);
        journal_header = std::move(b);
        return;
      }
      if (resume && mismatch.empty()) seen(std::move(j));
    });
    if (first) keep = 0;  // killed before the header was written: nothing to continue
    if (resume && !first && !mismatch.empty()) {
      ::close(fd_);
      fd_ = -1;
      if (mismatch.rfind("run.fingerprint.dumps", 0) == 0) {
        mismatch = (other_fingerprint_scheme(header, journal_header)
                        ? "it was written by an attnscope that fingerprinted its inputs another way: "
                        : "an input file (dump or weights) is not the one it was written for: ") +
                   mismatch;
      }
      throw UsageError("--resume: " + path_.string() +
                       " belongs to a different run (" + mismatch +
                       "); run without --resume to start over");
    }
    if (!resume && !first) {
      discarded_ = true;
      keep = 0;
    }
  }
  if (keep == 0) {
    std::vector<char> head(kMagic, kMagic + kMagicLen);
    append_frame(head, header);
    if (::ftruncate(fd_, 0) != 0) fail(path_, "cannot truncate the journal", errno);
    if (::lseek(fd_, 0, SEEK_SET) < 0) fail(path_, "cannot seek in the journal", errno);
    write_all(fd_, head.data(), head.size(), path_);
  } else {
    if (::ftruncate(fd_, static_cast<off_t>(keep)) != 0) {
      fail(path_, "cannot cut the journal's torn tail", errno);
    }
    if (::lseek(fd_, static_cast<off_t>(keep), SEEK_SET) < 0) {
      fail(path_, "cannot seek in the journal", errno);
    }
  }
  sync();
}

JournalWriter::~JournalWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void JournalWriter::append(const nlohmann::json& record) {
  std::vector<char> frame;
  append_frame(frame, record);
  write_all(fd_, frame.data(), frame.size(), path_);
}

void JournalWriter::sync() {
  if (fd_ >= 0 && ::fsync(fd_) != 0 && errno != EINVAL) fail(path_, "cannot sync the journal", errno);
}

namespace {

void delete_journal(const fs::path& path) {
  ::unlink(path.c_str());
  std::error_code ec;
  fs::remove(path.parent_path(), ec);  // the partial-runs folder, when nothing else is in it
}

}  // namespace

void JournalWriter::remove() {
  if (fd_ < 0) return;
  delete_journal(path_);
  ::close(fd_);
  fd_ = -1;
}

void JournalWriter::remove_when_reported() {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  journals_to_remove().push_back(path_);
}

std::vector<fs::path>& journals_to_remove() {
  static std::vector<fs::path> paths;
  return paths;
}

void remove_journals() {
  for (const fs::path& p : journals_to_remove()) delete_journal(p);
  journals_to_remove().clear();
}

void read_journal(const fs::path& path, const std::function<void(const nlohmann::json&)>& header,
                  const std::function<void(nlohmann::json&&)>& fn) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open the journal", errno);
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(path, "cannot stat the journal", err);
  }
  bool first = true;
  std::uint64_t used = 0;
  try {
    used = scan(fd, path, [&](nlohmann::json&& j) {
      if (first) {
        first = false;
        header(j);
        return;
      }
      fn(std::move(j));
    });
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  if (first || used != static_cast<std::uint64_t>(st.st_size)) {
    throw InputError(path.string(), "journal", "a complete journal",
                     "a journal cut short at byte " + std::to_string(used));
  }
}

nlohmann::json read_journal_header(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open the journal", errno);
  std::vector<char> buf;
  std::vector<char> chunk(1 << 16);
  nlohmann::json header;
  bool found = false;
  try {
    while (!found) {
      const ssize_t r = ::read(fd, chunk.data(), chunk.size());
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) fail(path, "cannot read the journal", errno);
      if (r == 0) break;
      buf.insert(buf.end(), chunk.data(), chunk.data() + r);
      if (buf.size() < kMagicLen) continue;
      if (std::memcmp(buf.data(), kMagic, kMagicLen) != 0) break;
      parse_frames(buf.data() + kMagicLen, buf.size() - kMagicLen, path.string(), kMagicLen,
                   [&](nlohmann::json&& j) {
                     if (!found) header = std::move(j), found = true;
                   });
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  if (!found) {
    throw InputError(path.string(), "journal", "a journal of attnscope with its header", "none");
  }
  return header;
}

std::string header_difference(const nlohmann::json& mine, const nlohmann::json& theirs) {
  if (mine == theirs) return "";
  if (mine.is_object() && theirs.is_object()) {
    for (const auto& [key, value] : mine.items()) {
      if (!theirs.contains(key)) return key + ": missing in the journal";
      const std::string inner = header_difference(value, theirs[key]);
      if (!inner.empty()) return key + (inner.find(':') == 0 ? "" : ".") + inner;
    }
    for (const auto& [key, value] : theirs.items()) {
      if (!mine.contains(key)) return key + ": only in the journal";
    }
  }
  constexpr auto kReplace = nlohmann::json::error_handler_t::replace;  // paths need not be UTF-8
  std::string a = mine.dump(-1, ' ', false, kReplace), b = theirs.dump(-1, ' ', false, kReplace);
  if (a.size() > 60) a = a.substr(0, 57) + "...";
  if (b.size() > 60) b = b.substr(0, 57) + "...";
  return ": " + a + " here, " + b + " in the journal";
}

}  // namespace attnscope::run
