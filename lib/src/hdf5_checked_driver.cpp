// A read-only HDF5 file driver that forwards to HDF5's own POSIX driver (sec2) and checks every
// global heap collection before the library decodes it (hdf5_util.hpp, checked_read_fapl).
//
// Why: variable-length strings (h5py's string attributes) live in global heap collections, and
// HDF5 (1.10 at least) trusts the sizes written there. One flipped bit in an object's size makes
// H5HG_read copy gigabytes into a buffer of a few bytes (SIGSEGV), and a free-space entry whose
// size becomes 0 makes the library walk the collection forever. A bit flip must give one line and
// exit 1, so the collection is walked here, the way the library walks it, and refused when any
// entry leaves its collection, repeats an index or cannot advance the walk.
//
// The library reads a collection as raw data (H5F_block_read maps H5FD_MEM_GHEAP to
// H5FD_MEM_DRAW), so a collection is recognised by its signature "GCOL" and version 1 at the
// start of a read; the library reads its first 4096 bytes, then the rest of a larger one.
#include "hdf5_util.hpp"

#include <H5FDpublic.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <vector>

namespace attnscope::h5 {
namespace {

struct CheckedFile {
  H5FD_t pub;  ///< must come first: the library fills and reads it
  H5FD_t* inner = nullptr;
};

H5FD_t* inner(const H5FD_t* f) { return reinterpret_cast<const CheckedFile*>(f)->inner; }

std::uint64_t le(const unsigned char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

/// Empty when the collection starting at `p` (of which `n` bytes were read) is well formed as
/// far as it was read; else what is wrong. Lengths are taken as 8 bytes, as every file written by
/// h5py and by attnscope has them.
std::string collection_fault(const unsigned char* p, std::size_t n) {
  constexpr std::uint64_t kHeader = 16;  // signature, version, 3 reserved, collection size
  const std::uint64_t size = le(p + 8, 8);
  if (size < kHeader) return "a collection size of " + std::to_string(size) + " bytes";
  std::vector<bool> seen(65536, false);
  std::uint64_t off = kHeader;
  while (off < size) {
    if (size - off < kHeader) break;  // too small for an entry: free space, as the library reads it
    if (off + kHeader > n) break;     // not read yet: checked when the whole collection is read
    const auto idx = static_cast<unsigned>(le(p + off, 2));
    const std::uint64_t bytes = le(p + off + 8, 8);
    const std::string where = "entry " + std::to_string(idx) + " at byte " + std::to_string(off) +
                              " of a " + std::to_string(size) + "-byte collection";
    if (bytes > size) return where + " claims " + std::to_string(bytes) + " bytes";
    const std::uint64_t need = idx > 0 ? kHeader + ((bytes + 7) / 8) * 8 : bytes;
    if (need < kHeader || need > size - off) {
      return where + " claims " + std::to_string(bytes) + " bytes, which do not fit in it";
    }
    if (idx > 0 && seen[idx]) return where + " repeats index " + std::to_string(idx);
    if (idx > 0) seen[idx] = true;
    off += need;
  }
  return {};
}

void push(const char* func, const std::string& msg) {
  H5Epush2(H5E_DEFAULT, __FILE__, func, __LINE__, H5E_ERR_CLS, H5E_VFL, H5E_READERROR, "%s", msg.c_str());
}

H5FD_t* checked_open(const char* name, unsigned flags, hid_t /*fapl*/, haddr_t maxaddr) {
  if ((flags & H5F_ACC_RDWR) != 0) {
    push("checked_open", "the checked driver reads only");
    return nullptr;
  }
  const hid_t sec2 = H5Pcreate(H5P_FILE_ACCESS);  // HDF5's default driver: sec2
  H5FD_t* in = H5FDopen(name, flags, sec2, maxaddr);
  H5Pclose(sec2);
  if (in == nullptr) return nullptr;
  auto* f = new (std::nothrow) CheckedFile();
  if (f == nullptr) {
    H5FDclose(in);
    push("checked_open", "out of memory");
    return nullptr;
  }
  f->inner = in;
  return &f->pub;
}

herr_t checked_close(H5FD_t* f) {
  auto* c = reinterpret_cast<CheckedFile*>(f);
  // A public call clears the thread's error stack on entry, and the library closes a file after
  // a failure (a lock held by a writer): keep the messages that say why.
  const hid_t stack = H5Eget_current_stack();
  const herr_t r = H5FDclose(c->inner);
  if (stack >= 0) H5Eset_current_stack(stack);
  delete c;
  return r;
}

int checked_cmp(const H5FD_t* a, const H5FD_t* b) { return H5FDcmp(inner(a), inner(b)); }

herr_t checked_query(const H5FD_t* f, unsigned long* flags) {
  if (f == nullptr) {  // asked of the driver, not of a file: sec2's features
    *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_DATA_SIEVE |
             H5FD_FEAT_AGGREGATE_SMALLDATA | H5FD_FEAT_POSIX_COMPAT_HANDLE;
    return 0;
  }
  return H5FDquery(inner(f), flags) < 0 ? -1 : 0;
}

haddr_t checked_get_eoa(const H5FD_t* f, H5FD_mem_t type) { return H5FDget_eoa(inner(f), type); }
herr_t checked_set_eoa(H5FD_t* f, H5FD_mem_t type, haddr_t a) { return H5FDset_eoa(inner(f), type, a); }
haddr_t checked_get_eof(const H5FD_t* f, H5FD_mem_t type) { return H5FDget_eof(inner(f), type); }
herr_t checked_get_handle(H5FD_t* f, hid_t fapl, void** handle) {
  return H5FDget_vfd_handle(inner(f), fapl, handle);
}

/// A chunk_location in progress on this thread: the raw reads HDF5 asks for are counted and
/// the last one's place kept, and none is made.
struct ChunkProbe {
  int reads = 0;
  haddr_t addr = HADDR_UNDEF;
  std::size_t size = 0;
};
thread_local ChunkProbe* probing = nullptr;

herr_t checked_read(H5FD_t* f, H5FD_mem_t type, hid_t dxpl, haddr_t addr, std::size_t size, void* buf) {
  if (probing != nullptr && type == H5FD_MEM_DRAW) {
    ++probing->reads;
    probing->addr = addr;
    probing->size = size;
    return 0;
  }
  if (H5FDread(inner(f), type, dxpl, addr, size, buf) < 0) return -1;
  const auto* p = static_cast<const unsigned char*>(buf);
  if (size < 16 || std::memcmp(p, "GCOL", 4) != 0 || p[4] != 1) return 0;
  // The library reads the first 4096 bytes, then only the rest of a larger collection: read the
  // whole collection here, so that the walk covers what the library will walk.
  const std::uint64_t whole = le(p + 8, 8);
  std::string fault;
  if (whole <= size) {
    fault = collection_fault(p, size);
  } else if (whole > H5FDget_eof(inner(f), type) || addr > H5FDget_eof(inner(f), type) - whole) {
    fault = "a collection size of " + std::to_string(whole) + " bytes, past the end of the file";
  } else {
    std::vector<unsigned char> all(static_cast<std::size_t>(whole));
    if (H5FDread(inner(f), type, dxpl, addr, all.size(), all.data()) < 0) return -1;
    fault = collection_fault(all.data(), all.size());
  }
  if (!fault.empty()) {
    push("checked_read", "damaged global heap collection at address " + std::to_string(addr) + ": " + fault);
    return -1;
  }
  return 0;
}

herr_t checked_write(H5FD_t*, H5FD_mem_t, hid_t, haddr_t, std::size_t, const void*) {
  push("checked_write", "the checked driver reads only");
  return -1;
}

herr_t checked_flush(H5FD_t*, hid_t, hbool_t) { return 0; }
herr_t checked_truncate(H5FD_t*, hid_t, hbool_t) { return 0; }
herr_t checked_lock(H5FD_t* f, hbool_t rw) { return H5FDlock(inner(f), rw); }
herr_t checked_unlock(H5FD_t* f) { return H5FDunlock(inner(f)); }

H5FD_class_t make_class() {
  H5FD_class_t c{};
#ifdef H5FD_CLASS_VERSION
  c.version = H5FD_CLASS_VERSION;
  c.value = static_cast<H5FD_class_value_t>(611);  // a user driver value (256 and up)
#endif
  c.name = "attnscope_checked";
  c.maxaddr = (haddr_t{1} << 62) - 1;
  c.fc_degree = H5F_CLOSE_WEAK;
  c.open = checked_open;
  c.close = checked_close;
  c.cmp = checked_cmp;
  c.query = checked_query;
  c.get_eoa = checked_get_eoa;
  c.set_eoa = checked_set_eoa;
  c.get_eof = checked_get_eof;
  c.get_handle = checked_get_handle;
  c.read = checked_read;
  c.write = checked_write;
  c.flush = checked_flush;
  c.truncate = checked_truncate;
  c.lock = checked_lock;
  c.unlock = checked_unlock;
  const H5FD_mem_t map[] = H5FD_FLMAP_DICHOTOMY;
  for (int i = 0; i < H5FD_MEM_NTYPES; ++i) c.fl_map[i] = map[i];
  return c;
}

hid_t checked_driver() {
  static const H5FD_class_t cls = make_class();
  static std::once_flag once;
  static hid_t id = -1;
  std::call_once(once, [] { id = H5FDregister(&cls); });
  return id;
}

}  // namespace

bool reads_through_checked_driver(hid_t file) {
  const hid_t driver = checked_driver();
  if (driver < 0) return false;
  const Handle fapl = plist(H5Fget_access_plist(file));
  const bool ours = fapl.valid() && H5Pget_driver(fapl.get()) == driver;
  H5Eclear2(H5E_DEFAULT);
  return ours;
}

bool chunk_location(hid_t ds, const hsize_t* coord, void* buf, haddr_t* addr, std::size_t* bytes,
                    unsigned* filters) {
  ChunkProbe probe;
  std::uint32_t mask = 0;
  probing = &probe;
  const herr_t rc = H5Dread_chunk(ds, H5P_DEFAULT, coord, &mask, buf);
  probing = nullptr;
  if (rc < 0 || probe.reads != 1) {
    H5Eclear2(H5E_DEFAULT);
    return false;  // no storage (HDF5 refuses to read it) or not the one read expected
  }
  *addr = probe.addr;
  *bytes = probe.size;
  *filters = mask;
  return true;
}

Handle checked_read_fapl() {
  Handle fapl = small_metadata_cache_fapl();
  const hid_t driver = checked_driver();
  if (driver >= 0) H5Pset_driver(fapl.get(), driver, nullptr);
  H5Eclear2(H5E_DEFAULT);
  return fapl;
}

}  // namespace attnscope::h5
