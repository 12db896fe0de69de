// The files of one run appear together or not at all (docs/cli/common-flags.md, "Output files").
//
// A run writes every file of its set into a staging folder inside the results folder
// (.attnscope-tmp-PID-RANDOM-HOST). publish() then checksums each file and, holding a lock on the
// results folder:
//   1. removes the old manifest (the run's JSON record, e.g. confusion.json): from here on the old
//      set is no longer complete, and readers refuse it;
//   2. renames each new file into place, then removes the files of the old set that the new one
//      lacks;
//   3. renames the new manifest into place, listing every file with its size and SHA-256.
// A reader trusts a file only when a manifest lists it and every file of that manifest has the
// listed size and checksum. So whenever the process dies, the folder holds the old complete set,
// the new complete set, or a set without a manifest: never a mix that passes for complete.
// A run that fails before publishing leaves the old set as it was.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

namespace attnscope::run {

class ResultFile;

class ResultSet {
 public:
  /// A set to be published into `dir` (which must exist) under the manifest `manifest` (a plain
  /// file name, e.g. "confusion.json"). Creates the staging folder, and removes staging folders
  /// of this host's earlier runs whose process is gone (killed with SIGKILL, say).
  ResultSet(std::filesystem::path dir, std::string manifest);
  /// Not published: removes the staging folder and everything in it.
  ~ResultSet();
  ResultSet(const ResultSet&) = delete;
  ResultSet& operator=(const ResultSet&) = delete;

  /// Adds file `name` (a plain file name) to the set and returns where to write it.
  std::filesystem::path stage(const std::string& name);
  /// Where `name` will be once published.
  std::filesystem::path final_path(const std::string& name) const { return dir_ / name; }
  const std::filesystem::path& dir() const { return dir_; }
  const std::filesystem::path& staging() const { return staging_; }

  /// Publishes the set with `record` (the run metadata) as its manifest, adding "files"
  /// ([{name, bytes, sha256}] in the order staged) and "manifest_format" (1). Returns the
  /// manifest's path. Throws attnscope::Error (naming the file) when a file cannot be read back
  /// or a step fails.
  std::filesystem::path publish(nlohmann::json record);

  /// A scratch file in the staging folder that is not a member of the set (a part to be joined
  /// into the result file `of` before publishing); its write errors name `of`'s final path and
  /// the reason, never the staging folder.
  std::unique_ptr<ResultFile> part_of(const std::string& of, const std::string& part);

  /// Call inside a catch block: rethrows the exception being handled with the staging folder's
  /// path replaced by the results folder's in its message, so errors name the files the user
  /// asked for.
  [[noreturn]] void rethrow_with_final_names() const;

 private:
  std::filesystem::path dir_, staging_;
  std::string manifest_;
  std::vector<std::string> names_;
  bool published_ = false;
};

/// A text file of a result set, written through a buffer that remembers the first write error;
/// close() flushes, syncs and reports it: "<final path>: cannot write: No space left on device".
class ResultFile {
 public:
  ResultFile(ResultSet& set, const std::string& name);
  ~ResultFile();
  ResultFile(const ResultFile&) = delete;
  ResultFile& operator=(const ResultFile&) = delete;
  std::ostream& stream() { return *os_; }
  void close();

 private:
  friend class ResultSet;  // writes the manifest, which is not a member of the set
  ResultFile(const std::filesystem::path& staged, std::filesystem::path final_name);
  struct Buf;
  std::filesystem::path final_;
  std::unique_ptr<Buf> buf_;
  std::unique_ptr<std::ostream> os_;
};

/// Throws InputError naming `path` when a result published there would replace something it must
/// not: a special file or a link, a file this run reads (input_files.hpp), or a file another
/// process holds open for writing. ResultSet checks every name when staging and publishing; a
/// command calls this first for a result whose name may be an input's (`maps.h5`), so that it is
/// refused before anything is computed.
void check_result_path(const std::filesystem::path& path);

/// The environment variable of the publishing test hook (see result_set.cpp).
inline constexpr const char* kPublishHookEnv = "ATTNSCOPE_TEST_PUBLISH_HOOK";

}  // namespace attnscope::run
