// SHA-256, for the checksums of a result set's manifest: OpenSSL's libcrypto (EVP interface)
// computes it. Python's hashlib.sha256 gives the same hex digest, so readers in python/ verify
// what the commands write.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX

namespace attnscope::run {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, std::size_t n);
  /// The digest as 64 lowercase hex digits; the object is spent afterwards.
  std::string hex_digest();
  /// The digest's 32 bytes; the object is spent afterwards.
  std::array<unsigned char, 32> digest();

 private:
  evp_md_ctx_st* ctx_;
};

/// `n` bytes as 2n lowercase hex digits, first byte first.
std::string to_hex(const unsigned char* bytes, std::size_t n);

/// The SHA-256 of a whole file as hex, and its size in bytes; throws attnscope::Error naming the
/// file when it cannot be read.
std::string sha256_file(const std::filesystem::path& path, std::uintmax_t* bytes = nullptr);

}  // namespace attnscope::run
