// mcpp debug — diagnosis tools (docs/DEBUGGING.md).
//   mcpp debug hang DUMP_DIR [--json]
//     reads every rank's flight-recorder dump (written on a watchdog timeout to <--save>/flight_recorder/, or
//     DUMP_DIR itself) and prints the diagnosis of tools/hang_analysis.h: each rank's coordinates and last call, the
//     last collective all members of each group completed, the first mismatch, the stuck calls with the ranks that
//     never issued them, and the culprit. --json: the same as one JSON object. A missing or malformed dump is an
//     mcpp::Error -> one "error: ..." line, exit 2.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <string>
#include <vector>

#include "apps/mcpp/command.h"
#include "mcpp/tools/hang_analysis.h"

namespace {

int run_debug(const std::vector<std::string>& args) {
  CLI::App app{"mcpp debug: diagnosis tools", "mcpp debug"};
  app.require_subcommand(1);
  CLI::App* hang = app.add_subcommand("hang", "name the stuck ranks, collective and group from flight-recorder dumps");
  std::string dir;
  hang->add_option("DUMP_DIR", dir, "directory of rank_<r>.json dumps (or a --save dir with flight_recorder/)")
      ->required();
  bool json = false;
  hang->add_flag("--json", json, "print the diagnosis as JSON");
  std::vector<std::string> rev(args.rbegin(), args.rend());
  try {
    app.parse(rev);
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    return 0;
  }
  if (*hang) {
    const mcpp::tools::HangReport r = mcpp::tools::analyze_hang(mcpp::tools::read_hang_dumps(dir));
    fmt::print("{}\n", json ? r.json.dump(2) : r.text);
  }
  return 0;
}

const mcpp::cli::Register reg{"debug", "diagnosis: `debug hang DUMP_DIR` names the stuck ranks and collective",
                              &run_debug};

}  // namespace
