// Pipeline schedule simulator — executes every rank's action list (schedules.h) together, with the
// blocking semantics of a batched P2P call: a Comm action posts all its ops at once and completes when
// every op's counterpart on the neighbour has been posted (rendezvous; a send does not complete before
// the matching recv is posted, the strictest model — NCCL's). Pure computation.
//
// Checks (mcpp::Error naming rank, action index and tensor on failure):
//   - pairing: per directed channel (rank -> neighbour, activations or grads) the k-th send pairs with
//     the k-th recv, counts equal, and the tensor sent is the one the receiver expects (rank pp-1's
//     chunk c feeds rank 0's chunk c+1 on the interleaved ring; rank 0's chunk-c grad feeds rank pp-1's
//     chunk c-1);
//   - data dependencies: Forward(mb, c) has its input (received, or it is rank 0 chunk 0), Backward has
//     its own Forward done and its output grad (received, or it is the last rank's last chunk), a send
//     sends a tensor already computed; every (mb, c) runs Forward exactly once (and Backward exactly once
//     unless the schedule is forward-only);
//   - deadlock: if no rank can advance while some have actions left, the error lists every stuck rank.
// Timing: compute costs per Forward / Backward action (one chunk) — uniform, or per (rank, chunk) for uneven
// stages (tools/layout_planner.h feeds measured per-layer costs) — P2P costs 0. Reports per stage busy
// time, finish time, bubble fraction = 1 - busy / makespan (makespan = the step's end over all ranks),
// and the max number of (microbatch, chunk) activations held for backward at once.
#pragma once
#include <cstdint>
#include <vector>

#include "mcpp/pipeline_parallel/schedules.h"

namespace mcpp::pipeline_parallel {

struct SimCosts {
  double forward = 1.0;   // one Forward action (one chunk of one microbatch)
  double backward = 2.0;  // one Backward action
  // Per (rank, chunk) costs [pp][V] replacing the two above when non-empty (both or neither; the shape must
  // match the schedules': an mcpp::Error otherwise).
  std::vector<std::vector<double>> forward_by_stage{}, backward_by_stage{};
};

// One executed action: compute runs [start, end); a Comm is posted at start and completes at end
// (end - start = time blocked waiting for the neighbour).
struct SimEvent {
  size_t action = 0;  // index into the rank's schedule
  double start = 0.0;
  double end = 0.0;
};

struct StageStats {
  std::vector<SimEvent> events;  // every action, in execution order
  double busy = 0.0;
  double finish = 0.0;
  double bubble_fraction = 0.0;
  int64_t max_in_flight = 0;  // activations (microbatch, chunk) waiting for their Backward
};

struct SimResult {
  double makespan = 0.0;
  std::vector<StageStats> stages;  // [pp]
};

// schedules[r] = rank r's actions; pp = schedules.size().
SimResult simulate(const std::vector<Schedule>& schedules, const SimCosts& costs);

// Theory for uniform per-stage costs: 1F1B (pp-1)/(M+pp-1); interleaved (pp-1)/(V*M+pp-1).
double theoretical_bubble_fraction(int64_t pp, int64_t num_microbatches, int64_t virtual_stages);

}  // namespace mcpp::pipeline_parallel
