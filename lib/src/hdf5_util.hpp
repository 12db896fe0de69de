// Thin RAII and error helpers over the HDF5 C API, private to the library.
//
// HDF5 prints its error stack to stderr by default; attnscope silences it (quiet_hdf5) and turns
// failures into one-line InputErrors that carry HDF5's innermost message instead. Debian's HDF5 is
// built thread-safe, and then the silencing and the error stack are per thread: every entry point
// that calls HDF5 calls quiet_hdf5() first, on whatever thread it runs.
#pragma once

#include <hdf5.h>

#include <string>
#include <utility>
#include <vector>

namespace attnscope::h5 {

/// Turns off HDF5's automatic error printing for the calling thread (idempotent, cheap).
void quiet_hdf5();

/// Every message on the calling thread's HDF5 error stack, from the failed API call down to where
/// the failure was detected; clears the stack. Call it right after the failing call: any other
/// HDF5 call (closing a handle included) clears the stack first.
std::vector<std::string> error_stack();

/// The most specific message on HDF5's current error stack (empty if none); clears the stack.
std::string last_error();

/// last_error() shortened to the system's reason where HDF5 quotes one (a failed write says
/// "... errno = 28, error message = 'No space left on device', ..."); "HDF5 error" when the stack
/// is empty. Clears the stack.
std::string system_reason();

/// Filters a dataset uses that this HDF5 cannot apply, as "filter N (name)"; empty when all are
/// available.
std::vector<std::string> unavailable_filters(hid_t dataset);

/// Owns one HDF5 identifier and closes it with the matching H5?close.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, -1)), closer_(o.closer_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, -1);
      closer_ = o.closer_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  [[nodiscard]] hid_t get() const { return id_; }
  [[nodiscard]] bool valid() const { return id_ >= 0; }
  /// Gives up ownership (after the identifier was closed by hand, to check the result).
  hid_t release() { return std::exchange(id_, -1); }
  void reset() {
    if (id_ >= 0 && closer_ != nullptr) closer_(id_);
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

inline Handle file(hid_t id) { return {id, H5Fclose}; }
inline Handle group(hid_t id) { return {id, H5Gclose}; }
inline Handle dataset(hid_t id) { return {id, H5Dclose}; }
inline Handle space(hid_t id) { return {id, H5Sclose}; }
inline Handle type(hid_t id) { return {id, H5Tclose}; }
inline Handle attr(hid_t id) { return {id, H5Aclose}; }
inline Handle plist(hid_t id) { return {id, H5Pclose}; }

/// True when `path` (relative to loc, "a/b/c") names an existing link, each component checked
/// in turn (H5Lexists fails rather than answering when an intermediate group is missing).
bool exists(hid_t loc, const std::string& path);

/// A file access list whose metadata cache (chunk indices, object headers) stays below 4 MiB
/// instead of HDF5's adaptive default of up to 32 MiB per open file: a dump's metadata is small,
/// and a run opens many files (shards) or writes one of any size.
Handle small_metadata_cache_fapl();

/// small_metadata_cache_fapl() with attnscope's read-only driver: HDF5's POSIX driver, plus a check
/// of every global heap collection (where variable-length strings live) before the library decodes
/// it, so that a damaged one is a read error, never a crash or an endless loop
/// (hdf5_checked_driver.cpp).
Handle checked_read_fapl();

/// True when `file` reads through checked_read_fapl()'s driver (chunk_location needs it).
bool reads_through_checked_driver(hid_t file);

/// Where chunk `coord` (the coordinates of its first element) of dataset `ds`, of a file that
/// reads_through_checked_driver, lies in the file: found through the dataset's chunk index, whose
/// lookup costs the logarithm of the chunks, not their number (HDF5 1.10's
/// H5Dget_chunk_info_by_coord walks every chunk before the one it finds). It asks H5Dread_chunk
/// for the chunk while the checked driver records the raw read instead of making it (`buf`, of
/// at least the chunk's bytes, is passed on and never written). False where the chunk has no
/// storage or HDF5 asked for anything but one raw read; else its address, bytes and filter mask.
bool chunk_location(hid_t ds, const hsize_t* coord, void* buf, haddr_t* addr, std::size_t* bytes,
                    unsigned* filters);

/// Empty when the root attribute `name` of the file at `path`, a variable-length string, refers
/// to its heap object soundly (or when the file's object headers are of a form this check does
/// not read: newer superblocks, whose headers HDF5 checksums); else what is wrong with it. Reads
/// the file itself, never through HDF5 (hdf5_vlen_check.cpp).
std::string vlen_string_attribute_fault(const std::string& path, const std::string& name);

/// The IEEE half type exactly as h5py builds numpy.float16 (so h5py reads it back as float16).
Handle half_type();

/// "float32", "float16", "float64", "int32", "uint8", "string", ... for messages.
std::string describe_type(hid_t type);

/// Dimensions of a dataset's dataspace.
std::vector<hsize_t> dims(hid_t dataset);

/// "[a, b, c]".
std::string shape_string(const std::vector<hsize_t>& dims);

}  // namespace attnscope::h5
