// Subcommand registry of the mcpp CLI. Each apps/mcpp/<name>.cpp registers itself:
//   static const mcpp::cli::Register reg{"tokenize", "encode stdin to token ids", &run_tokenize};
// A command returns the process exit code; it throws mcpp::Error for user mistakes, which main()
// prints as one line "error: ..." and turns into exit code 2.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace mcpp::cli {

// args excludes the program name and the subcommand (argv[2:]).
using CommandFn = int (*)(const std::vector<std::string>& args);

struct CommandInfo {
  std::string help;
  CommandFn fn;
};

inline std::map<std::string, CommandInfo>& commands() {
  static std::map<std::string, CommandInfo> table;
  return table;
}

struct Register {
  Register(const char* name, const char* help, CommandFn fn) { commands()[name] = {help, fn}; }
};

}  // namespace mcpp::cli
