// The input fingerprint's tree hash: the file's 64 MiB chunks hashed by the run's threads at once,
// then the hash of their digests in order.
#include "attnscope/run/hash_tree.hpp"

#include "attnscope/error.hpp"
#include "attnscope/run/sha256.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
// Compiled inline: Debian's libxxhash is built for baseline x86-64 (SSE2), the inline copy for
// this build's target (AVX2 where it has it), which hashes faster. XXH3's values are fixed by its
// specification: the same either way.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <omp.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

namespace attnscope::run {
namespace {

/// One hash in progress, either kind; digest() gives its bytes in the documented order.
class ChunkHasher {
 public:
  explicit ChunkHasher(TreeHash hash) {
    if (hash == TreeHash::sha256) {
      sha_ = std::make_unique<Sha256>();
    } else {
      xxh_.reset(XXH3_createState());
      if (!xxh_ || XXH3_128bits_reset(xxh_.get()) != XXH_OK) throw Error("XXH3-128: cannot start a hash");
    }
  }
  void update(const void* data, std::size_t n) {
    if (sha_) {
      sha_->update(data, n);
    } else if (XXH3_128bits_update(xxh_.get(), data, n) != XXH_OK) {
      throw Error("XXH3-128: cannot hash");
    }
  }
  std::vector<unsigned char> digest() {
    if (sha_) {
      const auto d = sha_->digest();
      return {d.begin(), d.end()};
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(xxh_.get()));
    return {c.digest, c.digest + sizeof(c.digest)};
  }

 private:
  struct FreeState {
    void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
  };
  std::unique_ptr<Sha256> sha_;
  std::unique_ptr<XXH3_state_t, FreeState> xxh_;
};

}  // namespace

const char* tree_hash_key(TreeHash hash) {
  return hash == TreeHash::sha256 ? "sha256_tree_64mib" : "xxh3_128_tree_64mib";
}

std::string hash_tree_file(const std::filesystem::path& path, TreeHash hash, int threads,
                           std::uintmax_t* bytes) {
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
  std::vector<std::vector<unsigned char>> digests(static_cast<std::size_t>(chunks));
  std::mutex failed_lock;
  std::string failed;  // the first error of any thread; the others stop at their next chunk
  const int team = static_cast<int>(std::clamp<std::int64_t>(threads, 1, std::max<std::int64_t>(chunks, 1)));
  // The read buffers are page-aligned: the kernel copies the page cache into them, and a
  // destination a few bytes past a page boundary (what malloc returns for 1 MiB) makes that copy's
  // stores alias its loads modulo 4 KiB: 2.3 GB/s against 11 on a Zen 3 EPYC (docs/benchmarks.md).
  constexpr std::size_t kBufBytes = std::size_t{1} << 20;
  const std::unique_ptr<unsigned char, decltype(&std::free)> bufs(
      static_cast<unsigned char*>(std::aligned_alloc(4096, kBufBytes * static_cast<std::size_t>(team))),
      &std::free);
  if (!bufs) {
    ::close(fd);
    throw Error(path.string() + ": cannot allocate the read buffers");
  }
#pragma omp parallel num_threads(team)
  {
    const std::span<unsigned char> buf(
        bufs.get() + kBufBytes * static_cast<std::size_t>(omp_get_thread_num()), kBufBytes);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t c = 0; c < chunks; ++c) {
      {
        const std::lock_guard<std::mutex> hold(failed_lock);
        if (!failed.empty()) continue;
      }
      try {
        ChunkHasher h(hash);
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
  ChunkHasher top(hash);
  for (const auto& d : digests) top.update(d.data(), d.size());
  if (bytes != nullptr) *bytes = size;
  const auto d = top.digest();
  return to_hex(d.data(), d.size());
}

}  // namespace attnscope::run
