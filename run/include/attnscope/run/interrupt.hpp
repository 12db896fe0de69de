// SIGINT, SIGTERM and SIGHUP: the command removes its temporary files and folders, prints one line
// on stderr and exits with 128 + the signal number.
//
// The signals are blocked in every thread and received by one thread of ours (sigwait), so the
// cleanup runs as ordinary code, not in a signal handler; a publish in progress (see
// result_set.hpp) finishes first, so a signal never leaves half a result set.
#pragma once

#include <filesystem>
#include <mutex>
#include <string>

namespace attnscope::run {

/// Blocks the signals and starts the thread that waits for them. Call in main() before any other
/// thread is started (threads inherit the blocked set). A signal that was ignored when the
/// program started (e.g. SIGINT in a background job of a script) stays ignored.
void install_interrupt_cleanup(const std::string& command);

/// From here on a signal ends the process without a message (the run has already said how it
/// ended: used when MPI ranks finish, where the launcher terminates the ranks still exiting).
void quiet_interrupts();

/// A temporary file or folder (removed with its contents) to delete if the command is
/// interrupted; forget_temporary() when it has been published or removed.
void add_temporary(const std::filesystem::path& p);
void forget_temporary(const std::filesystem::path& p);

/// While it lives, an interrupt waits (used around publishing); an interrupt that arrived
/// meanwhile takes effect when it is destroyed.
class InterruptDeferral {
 public:
  InterruptDeferral();
  ~InterruptDeferral();
  InterruptDeferral(const InterruptDeferral&) = delete;
  InterruptDeferral& operator=(const InterruptDeferral&) = delete;

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace attnscope::run
