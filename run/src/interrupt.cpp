#include "attnscope/run/interrupt.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <thread>

namespace attnscope::run {
namespace {

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};

struct State {
  std::mutex publish;  // held while a result set is published
  std::atomic<bool> interrupted{false};
  std::atomic<bool> quiet{false};
  std::mutex mutex;    // guards the fields below
  std::set<std::filesystem::path> temporaries;
  std::string command;
};

// Never destroyed: the waiting thread may use it while static objects are being destroyed.
State& state() {
  static State* s = new State;
  return *s;
}

[[noreturn]] void on_signal(int sig) {
  State& s = state();
  s.interrupted = true;
  std::lock_guard publishing(s.publish);  // a publish in progress finishes first
  std::lock_guard lock(s.mutex);
  for (const auto& p : s.temporaries) {
    // A writer may still add a file while the folder goes; a second pass catches it.
    for (int pass = 0; pass < 3; ++pass) {
      std::error_code ec;
      std::filesystem::remove_all(p, ec);
      if (!std::filesystem::exists(p, ec)) break;
    }
  }
  const char* name = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP";
  if (s.quiet) ::_exit(128 + sig);
  std::fprintf(stderr, "attnscope %s: interrupted by %s; temporary files removed\n",
               s.command.c_str(), name);
  std::fflush(stderr);
  ::_exit(128 + sig);
}

}  // namespace

void quiet_interrupts() { state().quiet = true; }

void install_interrupt_cleanup(const std::string& command) {
  state().command = command;
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kSignals) {
    struct sigaction old {};
    if (sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    sigaddset(&set, sig);
  }
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    int sig = 0;
    while (sigwait(&set, &sig) != 0) {
    }
    on_signal(sig);
  }).detach();
}

void add_temporary(const std::filesystem::path& p) {
  std::lock_guard lock(state().mutex);
  state().temporaries.insert(p);
}

void forget_temporary(const std::filesystem::path& p) {
  std::lock_guard lock(state().mutex);
  state().temporaries.erase(p);
}

InterruptDeferral::InterruptDeferral() : lock_(state().publish) {}

InterruptDeferral::~InterruptDeferral() {
  lock_.unlock();
  // The interrupt waited for us: let it end the process rather than racing it to a normal exit.
  while (state().interrupted) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace attnscope::run
