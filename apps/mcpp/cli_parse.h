// parse_args(app, args): CLI11 parsing of a subcommand's flags (args = argv[2:]) with `--help` / `-h` printing
// the help of the (sub)command asked about and ending the command with exit code 0 (CLI::Success, which
// main() turns into 0). Every command parses through it, so no `--help` is silent.
#pragma once
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <string>
#include <vector>

namespace mcpp::cli {

inline void parse_args(CLI::App& app, const std::vector<std::string>& args) {
  std::vector<std::string> rev(args.rbegin(), args.rend());  // CLI11 parses a reversed vector
  try {
    app.parse(rev);
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());  // delegates to the subcommand that was asked (`ckpt verify --help`)
    throw CLI::Success();
  } catch (const CLI::CallForAllHelp&) {
    fmt::print("{}", app.help("", CLI::AppFormatMode::All));
    throw CLI::Success();
  }
}

}  // namespace mcpp::cli
