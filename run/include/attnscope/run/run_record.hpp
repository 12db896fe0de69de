// The record of a run, published as the manifest of its result set (result_set.hpp), and what it
// records: the command line, the streaming loops' measurements. Shared by the command and the
// Python module's live analyses.
#pragma once

#include "attnscope/run/result_set.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace attnscope::analyses {
struct LoopStats;
}

namespace attnscope::run {

/// What this run's streaming loops measured (one run per process): the command's selections
/// share it, RunMetadata::publish records it under "results" (io_wait_seconds, io_wait_share of
/// the loops' time, and the read queue's sizes) when a loop ran.
std::shared_ptr<analyses::LoopStats> run_loop_stats();

/// Creates the results folder (and parents); throws InputError if it cannot.
std::filesystem::path ensure_out_dir(const std::string& dir);

/// The whole command line as typed (argv), set by main() (the Python module: the interpreter's
/// sys.argv); recorded in every run's metadata.
std::vector<std::string>& command_line();

/// The manifests this process has published (RunMetadata::publish), in order: a command whose
/// summary is then lost (standard output full or closed) withdraws them, so that a failed run
/// leaves no result set looking complete.
std::vector<std::filesystem::path>& published_manifests();

/// Run metadata, published as the manifest of the run's result set (<out>/<command>.json, or
/// FILE.h5.json for synth): command, the full command line, attnscope version, inputs,
/// parameters, start time, elapsed seconds, threads, anything added under "results", and the
/// list of files (result_set.hpp).
class RunMetadata {
 public:
  explicit RunMetadata(std::string command);
  nlohmann::json& params() { return j_["parameters"]; }
  nlohmann::json& inputs() { return j_["inputs"]; }
  nlohmann::json& results() { return j_["results"]; }
  /// Stamps elapsed time and threads and publishes `set` with this record as its manifest;
  /// returns the manifest's path.
  std::filesystem::path publish(ResultSet& set);

 private:
  nlohmann::json j_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace attnscope::run
