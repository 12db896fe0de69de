// The files this process reads as inputs (dumps, image sets, model weights: every HDF5 file the
// library opens), known by device, inode, size and modification time, so that a result set never
// replaces one of them
// (`maps --dump out/maps.h5 --out out` would otherwise write its maps.h5 over the dump).
#pragma once

#include <filesystem>

namespace attnscope {

/// Records `path` (an existing file) as an input of this process; thread-safe.
void note_input_file(const std::filesystem::path& path);

/// Whether `path` names, under this or any other name, a file recorded by note_input_file.
[[nodiscard]] bool is_input_file(const std::filesystem::path& path);

}  // namespace attnscope
