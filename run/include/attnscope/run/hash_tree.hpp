// The input fingerprint's hash of a whole file: a tree of 64 MiB chunks, hashed by several threads
// at once, whose value depends on the bytes alone (not on the number of threads).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace attnscope::run {

/// The hash of each chunk and of the chunks' digests.
enum class TreeHash {
  /// SHA-256 (OpenSSL's libcrypto), 32-byte digests. In Python:
  /// hashlib.sha256(b"".join(hashlib.sha256(c).digest() for c in chunks)).hexdigest().
  sha256,
  /// XXH3-128 (libxxhash), 16-byte digests in their canonical (big-endian) order, as `xxh128sum`
  /// prints them; about five times SHA-256's speed on one core. A check against accidental change
  /// (an edited or replaced input), not against a forger. In Python (python3-xxhash):
  /// xxhash.xxh3_128(b"".join(xxhash.xxh3_128(c).digest() for c in chunks)).hexdigest().
  xxh3_128,
};

/// The chunk size of hash_tree_file: 64 MiB.
inline constexpr std::uintmax_t kTreeChunkBytes = std::uintmax_t{1} << 26;

/// The name a fingerprint records the tree's value under: "sha256_tree_64mib" or
/// "xxh3_128_tree_64mib".
const char* tree_hash_key(TreeHash hash);

/// The hash of the digests of the file's consecutive kTreeChunkBytes chunks (the last one
/// shorter), concatenated in order (of nothing for an empty file), as lowercase hex; its size in
/// bytes. The chunks are hashed by up to `threads` threads at once. Throws attnscope::Error naming
/// the file when it cannot be read or changes size while it is read.
std::string hash_tree_file(const std::filesystem::path& path, TreeHash hash, int threads,
                           std::uintmax_t* bytes = nullptr);

}  // namespace attnscope::run
