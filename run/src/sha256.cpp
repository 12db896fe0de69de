// SHA-256 through OpenSSL's EVP interface (libcrypto picks the CPU's SHA extensions itself).
#include "attnscope/run/sha256.hpp"

#include "attnscope/error.hpp"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
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
  const auto d = digest();
  return to_hex(d.data(), d.size());
}

std::string to_hex(const unsigned char* bytes, std::size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    out += kHex[bytes[i] >> 4];
    out += kHex[bytes[i] & 0xfU];
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

}  // namespace attnscope::run
