// SHA-256 through OpenSSL's EVP interface (libcrypto picks the CPU's SHA extensions itself).
#include "attnscope/run/sha256.hpp"

#include "attnscope/error.hpp"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <omp.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

namespace attnscope::run {
namespace {

[[noreturn]] void fail(const char* what) {
  throw Error(std::string("SHA-256: OpenSSL's ") + what + " failed");
}

}  // namespace

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (ctx_ == nullptr) fail("EVP_MD_CTX_new");
  if (EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(ctx_);
    fail("EVP_DigestInit_ex");
  }
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_); }

void Sha256::update(const void* data, std::size_t n) {
  if (n > 0 && EVP_DigestUpdate(ctx_, data, n) != 1) fail("EVP_DigestUpdate");
}

std::array<unsigned char, 32> Sha256::digest() {
  unsigned char raw[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_DigestFinal_ex(ctx_, raw, &size) != 1) fail("EVP_DigestFinal_ex");
  if (size != 32) fail("SHA-256 digest size");
  std::array<unsigned char, 32> out{};
  std::copy(raw, raw + 32, out.begin());
  return out;
}

std::string Sha256::hex_digest() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (const unsigned char byte : digest()) {
    out += kHex[byte >> 4];
    out += kHex[byte & 0xfU];
  }
  return out;
}

std::string sha256_file(const std::filesystem::path& path, std::uintmax_t* bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path.string() + ": cannot read: " + std::strerror(errno));
  Sha256 h;
  std::vector<unsigned char> buf(1 << 20);
  std::uintmax_t total = 0;
  while (true) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw Error(path.string() + ": cannot read: " + std::strerror(err));
    }
    h.update(buf.data(), static_cast<std::size_t>(n));
    total += static_cast<std::uintmax_t>(n);
  }
  ::close(fd);
  if (bytes != nullptr) *bytes = total;
  return h.hex_digest();
}

std::string sha256_tree_file(const std::filesystem::path& path, int threads, std::uintmax_t* bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path.string() + ": cannot read: " + std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(path.string() + ": cannot read: " + std::strerror(err));
  }
  const auto size = static_cast<std::uintmax_t>(st.st_size);
  const auto chunks = static_cast<std::int64_t>((size + kTreeChunkBytes - 1) / kTreeChunkBytes);
  std::vector<std::array<unsigned char, 32>> digests(static_cast<std::size_t>(chunks));
  std::mutex failed_lock;
  std::string failed;  // the first error of any thread; the others stop at their next chunk
  const int team = static_cast<int>(std::clamp<std::int64_t>(threads, 1, std::max<std::int64_t>(chunks, 1)));
#pragma omp parallel num_threads(team)
  {
    std::vector<unsigned char> buf(std::size_t{1} << 20);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t c = 0; c < chunks; ++c) {
      {
        const std::lock_guard<std::mutex> hold(failed_lock);
        if (!failed.empty()) continue;
      }
      try {
        Sha256 h;
        const std::uintmax_t begin = static_cast<std::uintmax_t>(c) * kTreeChunkBytes;
        const std::uintmax_t end = std::min(size, begin + kTreeChunkBytes);
        for (std::uintmax_t at = begin; at < end;) {
          const std::size_t want = static_cast<std::size_t>(std::min<std::uintmax_t>(buf.size(), end - at));
          const ssize_t n = ::pread(fd, buf.data(), want, static_cast<off_t>(at));
          if (n < 0 && errno == EINTR) continue;
          if (n < 0) throw Error(path.string() + ": cannot read: " + std::strerror(errno));
          if (n == 0) {
            throw Error(path.string() + ": became shorter while it was read (" + std::to_string(size) +
                        " bytes when opened, " + std::to_string(at) + " now)");
          }
          h.update(buf.data(), static_cast<std::size_t>(n));
          at += static_cast<std::uintmax_t>(n);
        }
        digests[static_cast<std::size_t>(c)] = h.digest();
      } catch (const std::exception& e) {
        const std::lock_guard<std::mutex> hold(failed_lock);
        if (failed.empty()) failed = e.what();
      }
    }
  }
  struct stat after{};
  const bool same_size = ::fstat(fd, &after) == 0 && after.st_size == st.st_size;
  ::close(fd);
  if (!failed.empty()) throw Error(failed);
  if (!same_size) throw Error(path.string() + ": changed size while it was read");
  Sha256 top;
  for (const auto& d : digests) top.update(d.data(), d.size());
  if (bytes != nullptr) *bytes = size;
  return top.hex_digest();
}

}  // namespace attnscope::run
