// attnscope: one command, a subcommand per analysis (see apps/command.hpp).
#include "command.hpp"
#include "common.hpp"
#include "attnscope/run/interrupt.hpp"
#include "attnscope/run/mpi_world.hpp"

#include <hdf5.h>

#include "attnscope/dump.hpp"
#include "attnscope/notes.hpp"

#include <csignal>
#include <iostream>

namespace attnscope::app {

std::map<std::string, Command>& command_table() {
  static std::map<std::string, Command> table;
  return table;
}

namespace {

void print_usage(std::ostream& os) {
  os << "attnscope " << ATTNSCOPE_VERSION
     << " - take apart softmax, linear, InLine and MALA attention on Q/K/V dumps\n\n"
        "usage: attnscope <command> [options]     attnscope <command> --help\n\ncommands:\n";
  for (const auto& [name, cmd] : command_table()) {
    os << "  " << name << std::string(name.size() < 12 ? 12 - name.size() : 1, ' ') << cmd.summary
       << "\n";
  }
}

}  // namespace
}  // namespace attnscope::app

int main(int argc, char** argv) {
  using namespace attnscope::app;
  // HDF5 must not close files itself at exit: every file is closed by its owner, and a file
  // whose close failed (disk full) cannot be closed again without crashing inside the library.
  H5dont_atexit();
  if (argc < 2) {
    print_usage(std::cerr);
    return 2;
  }
  const std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    return run_guarded("help", [] {  // run_guarded: output that cannot be written is an error
      print_usage(std::cout);
      return 0;
    });
  }
  if (name == "--version") {
    return run_guarded("--version", [] {
      std::cout << "attnscope " << ATTNSCOPE_VERSION << "\n";
      // The CPU the build targets: speed only, never results (docs/reliability.md, "Portability").
      std::cout << "arch: " << (*ATTNSCOPE_ARCH ? ATTNSCOPE_ARCH : "x86-64 (compiler default)") << "\n";
      std::cout << "mpi: " << (mpi::built_with_mpi() ? "yes" : "no") << "\n";
#ifdef ATTNSCOPE_HAVE_CUDA
      std::cout << "cuda: yes\n";
#else
      std::cout << "cuda: no\n";
#endif
      return 0;
    });
  }
  auto it = command_table().find(name);
  if (it == command_table().end()) {
    std::cerr << "attnscope: unknown command '" << name << "' (see attnscope --help)\n";
    return 2;
  }
  // A closed pipe on standard output is a write error the command reports (exit 1, its set
  // withdrawn, its journal kept), not a silent death by SIGPIPE with the set left complete.
  std::signal(SIGPIPE, SIG_IGN);
  // Signals are blocked before MPI starts its threads, which inherit the mask.
  install_interrupt_cleanup(it->second.name);
  try {
    mpi::init(&argc, &argv);
  } catch (const std::exception& e) {
    std::cerr << "attnscope " << name << ": " << e.what() << "\n";
    return 2;
  }
  if (mpi::size() > 1 && !it->second.over_images) {
    if (mpi::root()) {
      std::cerr << "attnscope " << name << ": runs as one process, not over " << mpi::size()
                << " MPI ranks (only the analyses over a dump's images split over ranks)\n";
    }
    mpi::finalize();
    return 2;
  }
  command_line().assign(argv, argv + argc);
  std::vector<std::string> args(argv + 2, argv + argc);
  attnscope::set_dump_warning_handler(
      [&name](const std::string& m) { attnscope::hold_note("attnscope " + name + ": warning: " + m); });
  const int rc = run_guarded(it->second.name, [&] { return it->second.run(args); });
  if (mpi::size() > 1) quiet_interrupts();
  mpi::finalize();
  return rc;
}
