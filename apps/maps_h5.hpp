// The HDF5 file of `attnscope maps` (docs/cli/maps.md): one float64 dataset per map at
// /<variant>/image_<i>/layer_<l>/head_<h>/query_<t>, written into a result set's staging folder.
#pragma once

#include "attnscope/analyses/maps.hpp"

#include <hdf5.h>

#include <filesystem>
#include <string>
#include <vector>

namespace attnscope::app {

class MapsH5 {
 public:
  /// Creates `staged`; errors name `final_name`, the path the file will be published under.
  MapsH5(const std::filesystem::path& staged, std::filesystem::path final_name);
  /// Closes the file if close() was not called, ignoring errors (the set is not published).
  ~MapsH5();
  MapsH5(const MapsH5&) = delete;
  MapsH5& operator=(const MapsH5&) = delete;

  void write_map(const std::string& name, const analyses::AttentionMap& m);
  void root_int(const char* name, int v);
  /// Closes the file; throws attnscope::Error when HDF5 cannot write it out (disk full).
  void close();

 private:
  [[noreturn]] void fail(const std::string& object, const std::string& what) const;
  void int_attr(hid_t obj, const char* name, int v, const std::string& where) const;
  void double_attr(hid_t obj, const char* name, const std::vector<double>& v,
                   const std::string& where) const;
  std::filesystem::path final_;
  hid_t file_ = -1, lcpl_ = -1;
};

}  // namespace attnscope::app
