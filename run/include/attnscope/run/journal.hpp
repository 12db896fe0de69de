// The journal of an image run: one record per finished image, appended as it finishes, so that a
// run killed at any moment (kill -9 included) can continue where it stopped (--resume), and so
// that shards and MPI ranks can hand their images' records to the process that writes results.
//
// Format (little-endian): the line "attnscope journal 1\n", then frames. A frame is a 4-byte
// payload length, a 4-byte FNV-1a checksum of the payload, and the payload: the CBOR encoding of
// a JSON value. The first frame is the header (what the run is: command, fingerprint, images);
// each later frame is a record {"image": i, "record": ...}, whose long numeric arrays are CBOR
// byte strings of the values (record_arrays.hpp). A kill can leave only the last frame
// incomplete; readers drop such a tail, and anything else that fails to parse is an error naming
// the journal and the byte offset.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace attnscope::run {

/// Appends one frame holding `payload` to `out`.
void append_frame(std::vector<char>& out, const nlohmann::json& payload);

/// Parses the frames of `bytes` (no magic line), calling fn for each payload. Returns the number
/// of bytes that form complete frames; a torn last frame is left unread. `what` names the source
/// in errors ("<file> at byte N: ...").
std::size_t parse_frames(const char* bytes, std::size_t n, const std::string& what,
                         std::uint64_t offset,
                         const std::function<void(nlohmann::json&&)>& fn);

/// A journal being written by this process (an exclusive lock is held while it is open).
class JournalWriter {
 public:
  /// Opens `path`. With `resume`, an existing journal whose header equals `header` (its "args"
  /// aside) is continued
  /// (its complete records are kept, a torn tail cut off) and its records are passed to `seen`;
  /// one whose header differs is refused (UsageError saying what differs). Without `resume`, or
  /// when there is no journal, a new one is started. Throws UsageError when another process holds
  /// the journal.
  JournalWriter(std::filesystem::path path, const nlohmann::json& header, bool resume,
                const std::function<void(nlohmann::json&&)>& seen);
  ~JournalWriter();
  JournalWriter(const JournalWriter&) = delete;
  JournalWriter& operator=(const JournalWriter&) = delete;

  /// Appends a record; written to the file before returning (a kill -9 afterwards keeps it).
  void append(const nlohmann::json& record);
  /// Flushes to disk (fsync).
  void sync();
  /// Closes and deletes the journal (the run's results are published).
  void remove();
  /// Closes the journal and leaves its deletion to the command, once the summary of the
  /// published set has reached standard output (journals_to_remove): a run whose summary is
  /// lost fails, withdraws its set and keeps its journal for --resume.
  void remove_when_reported();
  const std::filesystem::path& path() const { return path_; }
  /// Whether an interrupted run's journal was found and discarded (no --resume).
  bool discarded_previous() const { return discarded_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  bool discarded_ = false;
};

/// Reads a complete journal: the header to `header`, every record to `fn`. A torn tail is an
/// error here (a journal handed on must be complete).
/// The journals of published runs, deleted by the command once its output is written
/// (remove_journals), kept when the run fails after all.
std::vector<std::filesystem::path>& journals_to_remove();
/// Deletes the journals of journals_to_remove() (and their folders where nothing else is left).
void remove_journals();

void read_journal(const std::filesystem::path& path,
                  const std::function<void(const nlohmann::json& header)>& header,
                  const std::function<void(nlohmann::json&&)>& fn);

/// The header of a journal, reading no further than its first frame.
nlohmann::json read_journal_header(const std::filesystem::path& path);

/// The first difference between two headers, as words ("parameters.eps: 0.001 here, 0.01 in
/// the journal"); empty when equal.
std::string header_difference(const nlohmann::json& mine, const nlohmann::json& theirs);

}  // namespace attnscope::run
