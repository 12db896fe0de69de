// An analysis that runs over the images of a dump, made resumable and divisible.
//
// Each image's contribution to the results is a record (JSON, stored exactly as CBOR): the
// analysis computes records, and folds them, in the selection's order, into its result files.
// Because the result files depend only on the records and their order, a run gives the same
// bytes however its images were computed:
//   - one process: records go to a journal (journal.hpp) as images finish; a run killed at any
//     moment continues with --resume from the first image the journal lacks;
//   - --shard i/n: the process computes the i-th contiguous block of the selection and publishes
//     the block's records (a shard set); `attnscope merge` folds the shards' records into the
//     files one plain run writes;
//   - MPI (mpirun -n R): rank r computes the r-th block of its share, rank 0 receives every
//     rank's records in order and writes the results.
// An error on any rank fails the whole run (one line from rank 0, the same exit code on every
// rank) and nothing is published.
//
// Library code: the attnscope command (apps/) drives its image runs through it, and its exit codes
// are exit_status.hpp's.
#pragma once

#include "attnscope/run/journal.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace attnscope::run {

/// --resume and --shard I/N (the command's flags: apps/common.hpp's add_run_control_options).
struct RunControl {
  bool resume = false;
  std::string shard;  ///< "I/N" (empty: the whole selection)
};

/// What identifies the inputs of a run for --resume and merge: each input file's size and the
/// XXH3-128 tree of all its bytes (hash_tree_file: 64 MiB chunks hashed by the run's threads at
/// once), so a moved or copied file still matches, one changed anywhere does not.
nlohmann::json dump_fingerprint(const std::vector<std::string>& files);

/// The fingerprint of a run: its command, attnscope's version, the dumps, and the parameters
/// that change results (everything in `params` except threads and device).
nlohmann::json run_fingerprint(const std::string& command, const std::vector<std::string>& dumps,
                               const nlohmann::json& params);

/// Set by `attnscope merge`: the shards' journals, in shard order, whose records replace
/// computing (see cmd_merge.cpp).
struct MergeInput {
  std::vector<std::filesystem::path> journals;
  std::vector<nlohmann::json> headers;
};
void set_merge_input(std::optional<MergeInput> input);

class ImageRun {
 public:
  using ApplyFn = std::function<void(int image, const nlohmann::json& record)>;

  /// `args`: the command's arguments, canonical (kept, without --out/--resume/--shard, for
  /// merge, which re-runs the command with them);
  /// `selection`: the run's images in order.
  ImageRun(const RunControl& control, const std::string& command,
           const std::vector<std::string>& args, const std::filesystem::path& out_dir,
           nlohmann::json fingerprint, const std::vector<int>& selection);
  ~ImageRun();
  ImageRun(const ImageRun&) = delete;
  ImageRun& operator=(const ImageRun&) = delete;

  /// The images this process computes, in order (its share less what a resumed journal holds).
  [[nodiscard]] const std::vector<int>& pending() const { return pending_; }

  /// Runs fn (which computes pending() and calls record() for each image, in order), collectively
  /// under MPI: if any rank fails, every rank throws (rank 0 with the failing rank's message).
  void compute(const std::function<void()>& fn);
  /// Journals the record of `image` (the next of pending()).
  void record(int image, const nlohmann::json& rec);

  /// Hands the records on. In the process that writes the results (rank 0 of a plain run, or
  /// merge), calls apply for every image of the selection in order, then publish(), and returns
  /// true. A shard run's rank 0 publishes the shard's records instead; other ranks send theirs
  /// to rank 0. Those return false: the caller prints nothing more. Collective under MPI.
  bool finish(const ApplyFn& apply, const std::function<void()>& publish);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<int> pending_;
};

}  // namespace attnscope::run
