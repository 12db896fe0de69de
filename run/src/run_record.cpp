#include "attnscope/run/run_record.hpp"

#include "attnscope/analyses/dump_loop.hpp"
#include "attnscope/error.hpp"

#include <omp.h>

#include <ctime>

namespace attnscope::run {

std::filesystem::path ensure_out_dir(const std::string& dir) {
  const std::filesystem::path p(dir.empty() ? std::string(".") : dir);
  std::error_code ec;
  std::filesystem::create_directories(p, ec);
  if (ec || !std::filesystem::is_directory(p)) {
    throw InputError(p.string(), "results folder", "a folder that exists or can be created",
                     ec ? ec.message() : std::string("a file that is not a folder"));
  }
  return p;
}

// ---------------------------------------------------------------------------------------------

namespace {

std::string iso8601_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

std::vector<std::string>& command_line() {
  static std::vector<std::string> args;
  return args;
}

std::vector<std::filesystem::path>& published_manifests() {
  static std::vector<std::filesystem::path> manifests;
  return manifests;
}

RunMetadata::RunMetadata(std::string command) : start_(std::chrono::steady_clock::now()) {
  j_["command"] = std::move(command);
  j_["version"] = ATTNSCOPE_VERSION;
  j_["command_line"] = command_line();
  j_["start_time"] = iso8601_now();
  j_["inputs"] = nlohmann::json::object();
  j_["parameters"] = nlohmann::json::object();
  j_["results"] = nlohmann::json::object();
}

std::shared_ptr<analyses::LoopStats> run_loop_stats() {
  static const auto stats = std::make_shared<analyses::LoopStats>();
  return stats;
}

std::filesystem::path RunMetadata::publish(ResultSet& set) {
  const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - start_;
  j_["elapsed_s"] = dt.count();
  if (const analyses::LoopStats& s = *run_loop_stats(); s.images > 0) {
    j_["results"]["io_wait_seconds"] = s.io_wait_seconds;
    j_["results"]["loop_seconds"] =
        s.loop_seconds;  // the streaming loops' wall time: elapsed_s less set-up
    j_["results"]["io_wait_share"] = s.loop_seconds > 0 ? s.io_wait_seconds / s.loop_seconds : 0.0;
    j_["results"]["read_queue"] = {{"images_in_flight", s.queue_depth},
                                   {"image_bytes", s.image_bytes},
                                   {"chunk_cache_bytes", s.chunk_cache_bytes},
                                   {"heads_read_by", s.computing_threads_read ? "computing threads" : "reader thread"}};
  }
  j_["threads"] = omp_get_max_threads();
  const std::filesystem::path manifest = set.publish(j_);
  published_manifests().push_back(manifest);
  return manifest;
}

}  // namespace attnscope::run
