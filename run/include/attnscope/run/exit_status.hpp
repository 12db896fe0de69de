// How a run ends: the exit codes of the attnscope command, the errors that carry one, and the
// code and one-line message an exception gives. Library code, so that the run machinery
// (image_run.hpp: a failure on any MPI rank fails every rank with one code) decides the same
// way for the command and any other front end.
#pragma once

#include "attnscope/error.hpp"

#include <exception>
#include <string>

namespace attnscope::run {

/// Exit codes: 0 ok, 1 input/numerical error, 2 usage error, 3 a check failed (verify),
/// 4 nothing to measure (no images selected, or no row of the selection could be measured).
inline constexpr int kExitInput = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitCheckFailed = 3;
inline constexpr int kExitNothingToMeasure = 4;

/// Thrown when a run has nothing to measure (a dump without images, every row degenerate):
/// reported on one line with exit 4, before any result file is written.
class NothingToMeasure : public Error {
 public:
  using Error::Error;
};

/// Ends a run with a given exit code and message (one line on stderr; nothing when the message is
/// empty: another process of the run reports it, see image_run.hpp).
class CodedExit : public Error {
 public:
  CodedExit(int code, const std::string& message) : Error(message), code_(code) {}
  [[nodiscard]] int code() const { return code_; }

 private:
  int code_;
};

/// The exit code and one-line message of an exception (an empty message: the CodedExit of a
/// process whose run another process reports): CodedExit its own, UsageError 2,
/// NothingToMeasure 4, anything else 1.
struct ExitStatus {
  int code = 0;
  std::string message;
};
ExitStatus exit_status(std::exception_ptr e);

}  // namespace attnscope::run
