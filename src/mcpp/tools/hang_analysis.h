// Hang forensics (`mcpp debug hang DUMP_DIR`; issue 33): reads every rank's flight-recorder dump
// (<DUMP_DIR>/flight_recorder/rank_<r>.json or <DUMP_DIR>/rank_<r>.json; schema: comm/flight_recorder.h) and names
//   - each rank's parallel coordinates (its index in every group it called: tp 1/2, dp 0/2, ...), its last call and
//     the iteration / microbatch / pipeline stage / virtual chunk it was at;
//   - the stuck ranks: the calls still queued or started, with the group members that never issued the same call
//     (a collective: the same group seq; a batch_p2p: the peers' matching p2p);
//   - per group, the last collective every member completed;
//   - the first mismatch: a (group, seq) whose members issued a different op, dtype or count;
//   - the culprit: a member of a stuck call that is in no call at all (it stopped calling collectives: a hang, a dead
//     or slow rank), else the rank whose stuck call started first (it issued a call its peers did not: a skipped or
//     extra collective).
//   - with --flight-recorder-checksums: the first all_reduce / all_gather / broadcast whose result checksums differ
//     across its group (members outside the agreeing majority named: a silent data corruption);
//   - with host stacks (SIGUSR1 / watchdog dumps: comm/host_stack.h): each rank's main-thread stack, demangled here
//     (abi::__cxa_demangle; the signal handler records raw backtrace_symbols lines only).
// A missing or malformed dump is an mcpp::Error naming the file.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mcpp::tools {

struct HangReport {
  std::string text;     // the diagnosis, for humans
  nlohmann::json json;  // the same, for tools: {"culprit_rank", "culprit_call", "stuck", "last_completed", ...}
};

// dumps: the parsed rank files (any order; one per rank).
HangReport analyze_hang(const std::vector<nlohmann::json>& dumps);
// Reads DUMP_DIR's rank files.
std::vector<nlohmann::json> read_hang_dumps(const std::string& dump_dir);

}  // namespace mcpp::tools
