// mcpp — the megatron-cpp CLI. `mcpp <command> [flags]`; `mcpp help` lists the commands; `mcpp --version` the build.
// Errors: mcpp::Error (and CLI11 parse errors) become one line on stderr and exit code 2.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <new>

#include "apps/mcpp/command.h"
#include "mcpp/core/error.h"
#include "mcpp/training/provenance.h"

namespace {
// The one error line, after what the command printed so far: stdout is buffered and stderr is not, so without the
// flush a log that takes both (2>&1) shows the error in the middle of earlier output (e.g. the arguments table).
void print_error(const char* what) {
  std::fflush(stdout);
  fmt::print(stderr, "error: {}\n", what);
}

void print_help() {
  fmt::print("usage: mcpp <command> [flags]   (mcpp <command> --help for its flags; mcpp --version)\n\ncommands:\n");
  for (const auto& [name, info] : mcpp::cli::commands()) fmt::print("  {:<12} {}\n", name, info.help);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "help" || std::string(argv[1]) == "--help" ||
      std::string(argv[1]) == "-h") {
    print_help();
    return argc < 2 ? 2 : 0;
  }
  std::string name = argv[1];
  if (name == "--version" || name == "version") {  // build + backends (training/provenance.h)
    fmt::print("{}", mcpp::format_version(mcpp::provenance()));
    return 0;
  }
  auto it = mcpp::cli::commands().find(name);
  if (it == mcpp::cli::commands().end()) {
    fmt::print(stderr, "error: unknown command '{}' (mcpp help lists the commands)\n", name);
    return 2;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    return it->second.fn(args);
  } catch (const CLI::Success&) {
    return 0;
  } catch (const CLI::ParseError& e) {
    print_error(e.what());
    return 2;
  } catch (const mcpp::Error& e) {
    print_error(e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    fmt::print(stderr, "error: mcpp {}: out of host memory (std::bad_alloc): the input asks for more memory than this "
               "host has\n", name);
    return 2;
  } catch (const std::exception& e) {
    print_error(e.what());
    return 2;
  }
}
