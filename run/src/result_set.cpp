#include "attnscope/run/result_set.hpp"

#include "attnscope/run/interrupt.hpp"
#include "attnscope/run/sha256.hpp"

#include "attnscope/error.hpp"
#include "attnscope/input_files.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <streambuf>
#include <thread>

namespace attnscope::run {
namespace {

namespace fs = std::filesystem;

constexpr const char* kStagingPrefix = ".attnscope-tmp-";

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

[[noreturn]] void fail(const fs::path& p, const std::string& what, int err) {
  throw Error(p.string() + ": " + what + ": " + std::strerror(err));
}

/// A plain file name: no folder part, not "." or "..".
bool plain_name(const std::string& n) {
  return !n.empty() && n != "." && n != ".." && n.find('/') == std::string::npos &&
         n.find('\0') == std::string::npos;
}

void fsync_path(const fs::path& p, int flags) {
  const int fd = ::open(p.c_str(), flags | O_CLOEXEC);
  if (fd < 0) fail(p, "cannot open to sync", errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems cannot sync a folder (EINVAL); their renames are as durable as they get.
  if (rc != 0 && err != EINVAL && err != EROFS) fail(p, "cannot sync", err);
}

void fsync_dir(const fs::path& p) { fsync_path(p, O_RDONLY | O_DIRECTORY); }

/// Removes staging folders of this host whose process no longer runs.
void remove_stale_staging(const fs::path& dir) {
  const std::string host = host_name();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(kStagingPrefix, 0) != 0) continue;
    // .attnscope-tmp-PID-RANDOM-HOST
    const std::string rest = n.substr(std::strlen(kStagingPrefix));
    const std::size_t a = rest.find('-');
    const std::size_t b = a == std::string::npos ? a : rest.find('-', a + 1);
    if (b == std::string::npos || rest.substr(b + 1) != host) continue;
    char* end = nullptr;
    const long pid = std::strtol(rest.c_str(), &end, 10);
    if (end != rest.c_str() + a || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    std::error_code rm;
    fs::remove_all(e.path(), rm);  // best effort: another run may be removing it too
  }
}

/// The names listed by an existing manifest (empty when there is none or it cannot be parsed:
/// then no file of the old set is known, and only names the new set reuses are replaced).
std::vector<std::string> listed_names(const fs::path& manifest) {
  std::vector<std::string> out;
  std::ifstream in(manifest);
  if (!in) return out;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("files") || !j["files"].is_array()) {
    return out;
  }
  for (const auto& f : j["files"]) {
    if (f.is_object() && f.contains("name") && f["name"].is_string()) {
      out.push_back(f["name"].get<std::string>());
    }
  }
  return out;
}

/// An exclusive lock on the results folder while a set is published, so that two runs
/// publishing into the same folder take turns.
class FolderLock {
 public:
  explicit FolderLock(const fs::path& dir) : fd_(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
    if (fd_ < 0) fail(dir, "cannot open the results folder", errno);
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) {
        const int err = errno;
        ::close(fd_);
        fail(dir, "cannot lock the results folder", err);
      }
    }
  }
  ~FolderLock() { ::close(fd_); }  // closing releases the lock
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  int fd_;
};

/// Test hook, for the CLI tests of interrupted publishing: ATTNSCOPE_TEST_PUBLISH_HOOK=kill@N
/// sends SIGKILL to the process at publishing step N, sleep@N pauses there for 3 seconds; both
/// print "attnscope: publish step N" on stderr first. Step 0: every file and the manifest are
/// staged and nothing visible has changed; 1: the old manifest is gone; 2...: after each rename
/// or removal that follows. Unset (always, outside tests), it does nothing.
class PublishHook {
 public:
  PublishHook() {
    const char* env = std::getenv(kPublishHookEnv);
    if (env == nullptr) return;
    const std::string s(env);
    const std::size_t at = s.find('@');
    if (at == std::string::npos) return;
    action_ = s.substr(0, at);
    step_ = std::atoi(s.c_str() + at + 1);
  }
  void step() {
    const int now = next_++;
    if (action_.empty() || now != step_) return;
    std::fprintf(stderr, "attnscope: publish step %d\n", now);
    std::fflush(stderr);
    if (action_ == "kill") ::raise(SIGKILL);
    if (action_ == "sleep") std::this_thread::sleep_for(std::chrono::seconds(3));
  }

 private:
  std::string action_;
  int step_ = -1;
  int next_ = 0;
};

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  for (std::size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size())) {
    s.replace(pos, from.size(), to);
  }
}

}  // namespace

namespace {

/// A published name may replace only a regular file (or nothing): never a device, a FIFO, a
/// socket, a folder or a symbolic link (run as root, `synth --out /dev/null` replaced the
/// system's /dev/null with a dump), and never a file the run reads (input_files.hpp).
void check_replaceable(const fs::path& p) {
  struct stat st{};
  if (::lstat(p.c_str(), &st) != 0) return;  // nothing there (or nothing we may see): a new file
  if (S_ISREG(st.st_mode) && is_input_file(p)) {
    throw InputError(p.string(), "", "a results path that is not an input of the run (choose another --out)",
                     "this run's input file, which its results would replace");
  }
  if (S_ISREG(st.st_mode)) {
    // A writer's lock (HDF5 takes an exclusive flock while a file is open for writing): the
    // writer would go on writing a file no longer in the folder, and its data would be lost.
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return;
    const bool locked = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    ::close(fd);
    if (locked) {
      throw InputError(p.string(), "", "a file no other process is writing",
                       "a file locked by another process (a writer still has it open)");
    }
    return;
  }
  const char* kind = S_ISCHR(st.st_mode)    ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISFIFO(st.st_mode) ? "a FIFO"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                     : S_ISDIR(st.st_mode)  ? "a folder"
                     : S_ISLNK(st.st_mode)  ? "a symbolic link"
                                            : "a special file";
  throw InputError(p.string(), "", "a regular file or nothing (attnscope replaces only regular files)", kind);
}

}  // namespace

void check_result_path(const fs::path& path) { check_replaceable(path); }

ResultSet::ResultSet(fs::path dir, std::string manifest)
    : dir_(std::move(dir)), manifest_(std::move(manifest)) {
  if (!plain_name(manifest_)) throw Error("bad manifest name '" + manifest_ + "'");
  if (dir_.empty()) dir_ = ".";
  check_replaceable(final_path(manifest_));
  remove_stale_staging(dir_);
  std::random_device rd;
  std::ostringstream name;
  name << kStagingPrefix << ::getpid() << "-" << std::hex << rd() << "-" << host_name();
  staging_ = dir_ / name.str();
  add_temporary(staging_);  // before it exists: an interrupt from here on removes it
  if (::mkdir(staging_.c_str(), 0755) != 0) {
    const int err = errno;
    forget_temporary(staging_);
    fail(dir_, "cannot create a temporary folder for the results", err);
  }
}

ResultSet::~ResultSet() {
  if (published_) return;
  std::error_code ec;
  fs::remove_all(staging_, ec);  // nothing to report from a destructor
  forget_temporary(staging_);
}

fs::path ResultSet::stage(const std::string& name) {
  if (!plain_name(name) || name == manifest_) throw Error("bad result file name '" + name + "'");
  check_replaceable(final_path(name));
  if (std::find(names_.begin(), names_.end(), name) == names_.end()) names_.push_back(name);
  return staging_ / name;
}

fs::path ResultSet::publish(nlohmann::json record) {
  if (published_) throw Error(final_path(manifest_).string() + ": published twice");
  nlohmann::json files = nlohmann::json::array();
  for (const std::string& name : names_) {
    const fs::path p = staging_ / name;
    std::error_code ec;
    if (!fs::is_regular_file(p, ec)) throw Error(final_path(name).string() + ": was not written");
    std::uintmax_t bytes = 0;
    const std::string sum = sha256_file(p, &bytes);
    fsync_path(p, O_RDONLY);
    files.push_back({{"name", name}, {"bytes", bytes}, {"sha256", sum}});
  }
  record["files"] = files;
  record["manifest_format"] = 1;
  {
    // The manifest is staged under its own name but is not a member of the set.
    ResultFile m(staging_ / manifest_, final_path(manifest_));
    // A path need not be UTF-8 on Linux, JSON text must be: bytes that are not UTF-8 are written
    // as U+FFFD (the record names the file readably; the journal keeps the exact bytes).
    m.stream() << record.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    m.close();
  }
  PublishHook hook;
  hook.step();  // 0: staged, nothing visible changed

  const InterruptDeferral defer;  // a signal from here on waits until the set is published
  const FolderLock lock(dir_);
  const fs::path manifest = final_path(manifest_);
  const std::vector<std::string> old = listed_names(manifest);
  // Checked again under the lock, before anything visible changes: what replaces or removes a
  // name must find a regular file there (or nothing).
  check_replaceable(manifest);
  for (const std::string& name : names_) check_replaceable(final_path(name));
  for (const std::string& name : old) {
    if (plain_name(name) && name != manifest_) check_replaceable(final_path(name));
  }
  if (::unlink(manifest.c_str()) != 0 && errno != ENOENT) fail(manifest, "cannot remove", errno);
  fsync_dir(dir_);
  hook.step();  // 1: the old set is withdrawn
  for (const std::string& name : names_) {
    if (::rename((staging_ / name).c_str(), final_path(name).c_str()) != 0) {
      fail(final_path(name), "cannot rename into place", errno);
    }
    hook.step();
  }
  const std::set<std::string> now(names_.begin(), names_.end());
  for (const std::string& name : old) {
    if (!plain_name(name) || name == manifest_ || now.count(name) != 0) continue;
    if (::unlink(final_path(name).c_str()) != 0 && errno != ENOENT) {
      fail(final_path(name), "cannot remove a file of the previous run", errno);
    }
    hook.step();
  }
  fsync_dir(dir_);
  if (::rename((staging_ / manifest_).c_str(), manifest.c_str()) != 0) {
    fail(manifest, "cannot rename into place", errno);
  }
  fsync_dir(dir_);
  hook.step();  // the new set is complete
  std::error_code ec;
  fs::remove(staging_, ec);
  forget_temporary(staging_);
  published_ = true;
  return manifest;
}

void ResultSet::rethrow_with_final_names() const {
  const auto fix = [this](const char* what) {
    std::string s(what);
    replace_all(s, staging_.string(), dir_.string());
    return s;
  };
  try {
    throw;
  } catch (const UsageError& e) {
    throw UsageError(fix(e.what()));
  } catch (const NumericalError& e) {
    throw NumericalError(fix(e.what()));
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(fix(e.what()));
  }
}

// ---------------------------------------------------------------------------------------------

/// An output buffer over a file descriptor that keeps the errno of the first failed write.
struct ResultFile::Buf : std::streambuf {
  int fd = -1;
  int error = 0;
  char data[1 << 16];

  Buf() { setp(data, data + sizeof data); }
  bool drain() {
    const char* p = pbase();
    std::size_t left = static_cast<std::size_t>(pptr() - pbase());
    while (left > 0 && error == 0) {
      const ssize_t n = ::write(fd, p, left);
      if (n < 0) {
        if (errno != EINTR) error = errno;
        continue;
      }
      p += n;
      left -= static_cast<std::size_t>(n);
    }
    setp(data, data + sizeof data);
    return error == 0;
  }
  int_type overflow(int_type c) override {
    if (!drain()) return traits_type::eof();
    if (!traits_type::eq_int_type(c, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(c);
      pbump(1);
    }
    return traits_type::not_eof(c);
  }
  int sync() override { return drain() ? 0 : -1; }
};

std::unique_ptr<ResultFile> ResultSet::part_of(const std::string& of, const std::string& part) {
  if (!plain_name(part) || part == manifest_) throw Error("bad part file name '" + part + "'");
  check_replaceable(final_path(of));
  return std::unique_ptr<ResultFile>(new ResultFile(staging_ / part, final_path(of)));
}

ResultFile::ResultFile(ResultSet& set, const std::string& name)
    : ResultFile(set.stage(name), set.final_path(name)) {}

ResultFile::ResultFile(const fs::path& staged, fs::path final_name)
    : final_(std::move(final_name)), buf_(std::make_unique<Buf>()) {
  buf_->fd = ::open(staged.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (buf_->fd < 0) fail(final_, "cannot create", errno);
  os_ = std::make_unique<std::ostream>(buf_.get());
}

ResultFile::~ResultFile() {
  if (buf_->fd >= 0) ::close(buf_->fd);  // an unclosed file is never published
}

void ResultFile::close() {
  if (buf_->fd < 0) return;
  os_->flush();
  int err = buf_->error;
  if (err == 0 && os_->fail()) err = EIO;
  if (err == 0 && ::fsync(buf_->fd) != 0 && errno != EINVAL) err = errno;
  if (::close(buf_->fd) != 0 && err == 0) err = errno;
  buf_->fd = -1;
  if (err != 0) fail(final_, "cannot write", err);
}

}  // namespace attnscope::run
