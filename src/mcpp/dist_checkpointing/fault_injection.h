// Fault injection for checkpoint-save kill tests (environment-controlled; inert when unset).
//
// Contract: fault_point(name) raises SIGKILL in this process when
//   MCPP_FAULT_KILL_AT == name, and MCPP_FAULT_KILL_RANK is unset or equals the rank set by
//   set_fault_context(),
//   and MCPP_FAULT_KILL_ITERATION is unset or equals the iteration set there.
// MCPP_FAULT_FAIL_AT == name (same filters) instead throws an mcpp::Error "injected failure at <name>"
// (a failed write, e.g. a full disk: the save must fail cleanly and leave the previous checkpoint latest).
// The named points of a sharded save are listed in docs/CHECKPOINT_FORMAT.md ("Kill points").
#pragma once
#include <cstdint>

namespace mcpp::dist_checkpointing {

void set_fault_context(int64_t iteration, int rank);
void fault_point(const char* name);

}  // namespace mcpp::dist_checkpointing
