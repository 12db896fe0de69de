// A small HDF5 file of named float64 matrices with integer and float64-list attributes: the
// writer of HDF5 result files (`attnscope maps` writes maps.h5 with it). Dumps have their own
// writer (dump.hpp).
//
// Nothing is reported as written until close() succeeds: close() flushes and closes the file and
// throws when either fails (a full disk), so that a caller publishing the file (a result set)
// never publishes one whose last bytes were lost.
#pragma once

#include "attnscope/layout.hpp"

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace attnscope {

/// Attributes of one object, written in this order: the integers (int32 scalars), then the lists
/// (float64, one dimension; an empty list has a null dataspace).
struct Hdf5Attributes {
  std::vector<std::pair<std::string, int>> ints;
  std::vector<std::pair<std::string, std::vector<double>>> doubles;
};

class Hdf5Writer {
 public:
  /// Creates (truncates) `path`. Errors name `display_name` (e.g. the path the file will be
  /// published under), then the object, what failed and HDF5's reason, shortened to the
  /// system's own where HDF5 quotes one ("No space left on device"). Throws attnscope::Error.
  Hdf5Writer(const std::filesystem::path& path, std::string display_name);
  /// Closes the file if close() was not called, ignoring errors (the file is not to be used).
  ~Hdf5Writer();
  Hdf5Writer(const Hdf5Writer&) = delete;
  Hdf5Writer& operator=(const Hdf5Writer&) = delete;

  /// A rows x cols float64 dataset at `name` ("/a/b/c": missing groups are created) holding m,
  /// with the given attributes.
  void write_matrix(const std::string& name, const MatD& m, const Hdf5Attributes& attributes = {});
  /// Attributes of the root group.
  void write_root_attributes(const Hdf5Attributes& attributes);
  /// Flushes and closes the file; throws attnscope::Error when HDF5 cannot write it out.
  void close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace attnscope
