// The process's input files (input_files.hpp).
#include "attnscope/input_files.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <mutex>
#include <vector>

namespace attnscope {
namespace {

/// A file by device and inode, with its size and modification time: an inode freed and reused
/// for another file while the process runs is not taken for the input it was.
struct FileId {
  dev_t dev;
  ino_t ino;
  off_t size;
  long long mtime_ns;
  bool operator==(const FileId& o) const {
    return dev == o.dev && ino == o.ino && size == o.size && mtime_ns == o.mtime_ns;
  }
};

struct Inputs {
  std::mutex mutex;
  std::vector<FileId> ids;
};

Inputs& inputs() {
  static Inputs in;
  return in;
}

bool file_id(const std::filesystem::path& path, FileId* id) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return false;
  *id = {st.st_dev, st.st_ino, st.st_size,
         static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec};
  return true;
}

}  // namespace

void note_input_file(const std::filesystem::path& path) {
  FileId id;
  if (!file_id(path, &id)) return;
  Inputs& in = inputs();
  const std::lock_guard<std::mutex> lock(in.mutex);
  if (std::find(in.ids.begin(), in.ids.end(), id) == in.ids.end()) in.ids.push_back(id);
}

bool is_input_file(const std::filesystem::path& path) {
  FileId id;
  if (!file_id(path, &id)) return false;
  Inputs& in = inputs();
  const std::lock_guard<std::mutex> lock(in.mutex);
  return std::find(in.ids.begin(), in.ids.end(), id) != in.ids.end();
}

}  // namespace attnscope
