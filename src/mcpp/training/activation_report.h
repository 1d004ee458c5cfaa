// Per-stage activation memory report of the schedule (`mcpp train`, every run; the bubble report sits next to
// it at pp > 1): for each pipeline stage, the peak number of live per-microbatch contexts, the peak
// bytes they held together and the bytes of one context (schedule_runner.h measures them after every
// forward; activation_memory.h counts each storage once). Maxima over the training steps and over the
// stage's ranks (TP/DP ranks of one stage hold the same shapes).
//   {"event":"pipeline_activation_memory","stages":[{"stage":s,"in_flight":n,"peak_bytes":p,
//     "context_bytes":c,"model_state_bytes":m,"ranks":k, "planned_in_flight":n', "planned_peak_bytes":p',
//     "planned_context_bytes":c', "planned_model_state_bytes":m'},...]}
// The planned_* fields (tools/memory_planner.h; add_planned_activations) are the plan's for the same stage:
// equal to the measured ones — the CLI tests assert it at TP / SP / PP / VP / recompute layouts (the model
// state up to the distributed optimizer's bucket padding).
// peak_bytes = in_flight * context_bytes when every microbatch has the same shape (the last stage's
// contexts also hold the logits).
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "mcpp/comm/communicator.h"
#include "mcpp/tools/memory_planner.h"

namespace mcpp::timeline {

struct StageMemory {
  int64_t max_in_flight = 0;
  int64_t peak_activation_bytes = 0;
  int64_t context_bytes = 0;
  int64_t model_state_bytes = 0;  // params + main grads + fp32 main params + optimizer state allocated
};

// Collective on world: every rank passes its stage and measurements; returns the report on every rank.
nlohmann::json gather_activation_report(comm::Communicator& world, int stage, const StageMemory& mine);
// Adds planned_in_flight / planned_peak_bytes / planned_context_bytes (the largest chunk's) to each stage.
void add_planned_activations(nlohmann::json& report, const tools::MemoryPlan& plan);
std::string format_activation_report(const nlohmann::json& report);

}  // namespace mcpp::timeline
