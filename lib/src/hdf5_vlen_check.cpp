// A root string attribute's heap reference, checked before HDF5 follows it (hdf5_util.hpp).
//
// Why: in files with version-0/1 superblocks (h5py's libver "earliest" and "v110", which the
// weights exporter uses) object headers carry no checksum, and HDF5 1.10 trusts the reference a
// variable-length string attribute stores there: a flipped bit in its object index makes
// H5HG_read index past its table (SIGSEGV), one in its length makes it copy the heap object into
// a smaller buffer, one in the string's base type size makes it allocate gigabytes. The root
// group's object header is parsed here, read-only and with every offset bounded, and the
// attribute's reference compared with the collection it names (itself checked as the library
// walks it, hdf5_checked_driver.cpp). Anything this parser does not know (newer superblocks,
// whose object headers are checksummed; shared datatypes; dense attribute storage) is left to
// HDF5: the check refuses only what it has read and found wrong.
#include "hdf5_util.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace attnscope::h5 {
namespace {

struct File {
  int fd = -1;
  std::uint64_t size = 0;
  ~File() {
    if (fd >= 0) ::close(fd);
  }
  /// n bytes at `at`, or nothing when they are not all in the file.
  std::optional<std::vector<unsigned char>> read(std::uint64_t at, std::uint64_t n) const {
    if (at > size || n > size - at || n > (64u << 20)) return std::nullopt;
    std::vector<unsigned char> b(static_cast<std::size_t>(n));
    std::size_t got = 0;
    while (got < b.size()) {
      const ssize_t r = ::pread(fd, b.data() + got, b.size() - got, static_cast<off_t>(at + got));
      if (r <= 0) return std::nullopt;
      got += static_cast<std::size_t>(r);
    }
    return b;
  }
};

std::uint64_t le(const unsigned char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::size_t pad8(std::size_t n) { return (n + 7) / 8 * 8; }

/// The data of attribute message `msg` (its body, `n` bytes) when it is named `name` and holds a
/// variable-length string: a fault, or "" when it is sound, or nothing when it is not that
/// attribute or not a form this parser reads.
std::optional<std::string> check_message(const File& f, const unsigned char* msg, std::size_t n,
                                         const std::string& name) {
  if (n < 8) return std::nullopt;
  const unsigned version = msg[0];
  const unsigned flags = msg[1];
  if (version < 1 || version > 3 || (version >= 2 && (flags & 0x3) != 0)) return std::nullopt;  // shared types
  const std::size_t name_size = le(msg + 2, 2), type_size = le(msg + 4, 2), space_size = le(msg + 6, 2);
  std::size_t at = version == 3 ? 9 : 8;
  const auto part = [version](std::size_t s) { return version == 1 ? pad8(s) : s; };
  if (at + part(name_size) + part(type_size) + part(space_size) > n || name_size == 0) return std::nullopt;
  const std::string stored(reinterpret_cast<const char*>(msg + at), name_size - 1);
  if (stored != name || msg[at + name_size - 1] != 0) return std::nullopt;
  at += part(name_size);
  const unsigned char* t = msg + at;
  at += part(type_size);
  at += part(space_size);
  // Datatype: class 9 (variable-length) with type 1 (string) in its first flag bits.
  if (type_size < 8 + 8 || (t[0] & 0x0f) != 9 || (t[1] & 0x0f) != 1) return std::nullopt;
  if ((t[8] & 0x0f) != 0) return std::nullopt;  // a base other than h5py's one-byte integer
  const std::uint64_t base_size = le(t + 8 + 4, 4);  // the base type's header: class, flags, size
  if (base_size != 1) {
    return "its string type claims characters of " + std::to_string(base_size) + " bytes";
  }
  // The stored reference: length (4), collection address (8), object index (4).
  if (at + 16 > n) return std::nullopt;
  const std::uint64_t length = le(msg + at, 4), addr = le(msg + at + 4, 8);
  const unsigned index = static_cast<unsigned>(le(msg + at + 12, 4));
  if (length == 0 && addr == 0) return std::string();  // a null string
  const std::optional<std::vector<unsigned char>> head = f.read(addr, 16);
  if (!head || std::memcmp(head->data(), "GCOL", 4) != 0) {
    return "its heap reference points at byte " + std::to_string(addr) + ", where no heap collection starts";
  }
  const std::uint64_t size = le(head->data() + 8, 8);
  const std::optional<std::vector<unsigned char>> heap = f.read(addr, size);
  if (!heap) return "its heap collection at byte " + std::to_string(addr) + " runs past the end of the file";
  // Find the entry as the library does: walk the collection (checked by the driver already).
  for (std::uint64_t off = 16; off + 16 <= size;) {
    const auto idx = static_cast<unsigned>(le(heap->data() + off, 2));
    const std::uint64_t bytes = le(heap->data() + off + 8, 8);
    if (idx == index && idx != 0) {
      if (bytes != length) {
        return "its heap reference says " + std::to_string(length) + " bytes, the heap entry " +
               std::to_string(index) + " holds " + std::to_string(bytes);
      }
      return std::string();
    }
    const std::uint64_t need = idx > 0 ? 16 + pad8(static_cast<std::size_t>(bytes)) : bytes;
    if (need < 16 || bytes > size) break;  // the driver refuses such a collection
    off += need;
  }
  return "its heap reference names entry " + std::to_string(index) + ", which the collection at byte " +
         std::to_string(addr) + " does not hold";
}

}  // namespace

std::string vlen_string_attribute_fault(const std::string& path, const std::string& name) {
  File f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) return {};
  const off_t end = ::lseek(f.fd, 0, SEEK_END);
  if (end <= 0) return {};
  f.size = static_cast<std::uint64_t>(end);
  const std::optional<std::vector<unsigned char>> sb = f.read(0, 96);
  if (!sb || std::memcmp(sb->data(), "\x89HDF\r\n\x1a\n", 8) != 0) return {};  // userblock: not read here
  const unsigned version = (*sb)[8];
  if (version > 1 || (*sb)[13] != 8 || (*sb)[14] != 8) return {};  // checksummed headers, or odd sizes
  const std::size_t vars = version == 1 ? 28 : 24;  // K values and flags (+ indexed storage K)
  const std::uint64_t base = le(sb->data() + vars, 8);
  // Root symbol table entry after base, free-space, end-of-file and driver addresses: its link
  // name offset, then its object header address.
  const std::uint64_t root = base + le(sb->data() + vars + 32 + 8, 8);
  // Chunks of the version-1 object header: the first after its 16-byte prefix, then every
  // continuation message's block.
  const std::optional<std::vector<unsigned char>> prefix = f.read(root, 16);
  if (!prefix || (*prefix)[0] != 1) return {};
  std::vector<std::pair<std::uint64_t, std::uint64_t>> chunks{{root + 16, le(prefix->data() + 8, 4)}};
  for (std::size_t c = 0; c < chunks.size() && c < 64; ++c) {
    const std::optional<std::vector<unsigned char>> chunk = f.read(chunks[c].first, chunks[c].second);
    if (!chunk) return {};
    for (std::size_t at = 0; at + 8 <= chunk->size();) {
      const std::uint64_t type = le(chunk->data() + at, 2), size = le(chunk->data() + at + 2, 2);
      if (at + 8 + size > chunk->size()) break;
      const unsigned char* body = chunk->data() + at + 8;
      if (type == 0x10 && size >= 16) chunks.emplace_back(base + le(body, 8), le(body + 8, 8));
      if (type == 0x0c) {
        const std::optional<std::string> fault = check_message(f, body, static_cast<std::size_t>(size), name);
        if (fault) return *fault;
      }
      at += 8 + static_cast<std::size_t>(size);
    }
  }
  return {};
}

}  // namespace attnscope::h5
