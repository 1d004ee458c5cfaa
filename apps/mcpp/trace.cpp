// mcpp trace — pipeline trace tools.
//   mcpp trace summarize PATH [--skip-steps K]
//     reads a Chrome/Perfetto trace written by `mcpp train --timeline PATH` and prints one row per rank:
//     forward / backward / p2p / idle / compute∩p2p overlap / span (ms) and the bubble
//     1 - busy / span (tools/trace_summary.h: interval unions, not summed durations), then the slowest
//     stage, the theoretical bubble and the clock (host / device time). --skip-steps K leaves the first K
//     steps out (warm-up). A missing or malformed file, or K >= the trace's steps, is an mcpp::Error ->
//     one "error: ..." line, exit 2.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

#include "apps/mcpp/command.h"
#include "mcpp/tools/trace_summary.h"

namespace {

int run_trace(const std::vector<std::string>& args) {
  CLI::App app{"mcpp trace: pipeline trace tools", "mcpp trace"};
  app.require_subcommand(1);
  CLI::App* summarize = app.add_subcommand("summarize", "per-rank F/B/P2P/idle time, bubble, slowest stage");
  std::string path;
  summarize->add_option("PATH", path, "trace JSON written by mcpp train --timeline")->required();
  int64_t skip_steps = 0;
  summarize->add_option("--skip-steps", skip_steps, "leave the first K steps out (warm-up)")
      ->check(CLI::NonNegativeNumber);
  std::vector<std::string> rev(args.rbegin(), args.rend());
  try {
    app.parse(rev);
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    return 0;
  }
  if (*summarize)
    fmt::print("{}", mcpp::tools::format_summary(mcpp::tools::summarize(mcpp::tools::read_trace(path), skip_steps)));
  return 0;
}

const mcpp::cli::Register reg{"trace", "pipeline trace tools (summarize a --timeline trace)", &run_trace};

}  // namespace
