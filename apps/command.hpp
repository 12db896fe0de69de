// Subcommands register themselves: each apps/cmd_<name>.cpp defines one static CommandRegistration,
// and main.cpp dispatches `attnscope <name> ...` to it. Adding a subcommand needs no edit elsewhere.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace attnscope::app {

struct Command {
  std::string name;
  std::string summary;  ///< one line for `attnscope --help`
  /// Runs with the arguments after the subcommand name. Returns the exit code.
  std::function<int(const std::vector<std::string>& args)> run;
  /// Whether it runs over a dump's images through ImageRun (run/: attnscope/run/image_run.hpp), and so may be split
  /// over MPI ranks; other commands refuse to run under MPI with more than one rank.
  bool over_images = false;
};

std::map<std::string, Command>& command_table();

struct CommandRegistration {
  explicit CommandRegistration(Command c) {
    auto name = c.name;
    command_table().emplace(std::move(name), std::move(c));
  }
};

}  // namespace attnscope::app
