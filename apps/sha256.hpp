// SHA-256 (FIPS 180-4), for the checksums of a result set's manifest. Python's hashlib.sha256
// gives the same hex digest, so readers in python/ verify what the commands write.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace attnscope::app {

class Sha256 {
 public:
  /// `allow_hardware` false: the portable code only (tests compare the two paths).
  explicit Sha256(bool allow_hardware = true);
  /// Whether this CPU has the SHA extensions (SHA-NI) that update() uses when allowed.
  static bool hardware_available();
  void update(const void* data, std::size_t n);
  /// The digest as 64 lowercase hex digits; the object is spent afterwards.
  std::string hex_digest();

 private:
  void block(const unsigned char* p);
  void blocks(const unsigned char* p, std::size_t count);  ///< count 64-byte blocks
  bool hardware_ = false;
  std::array<std::uint32_t, 8> h_;
  std::array<unsigned char, 64> buf_{};
  std::size_t used_ = 0;
  std::uint64_t bytes_ = 0;
};

/// The SHA-256 of a whole file as hex, and its size in bytes; throws attnscope::Error naming the
/// file when it cannot be read.
std::string sha256_file(const std::filesystem::path& path, std::uintmax_t* bytes = nullptr);

}  // namespace attnscope::app
