// Profile-driven pipeline layout (`mcpp plan layout`, issue 34 item 5, experiment E06): from measured per-layer
// costs, the --pipeline-model-parallel-layout (Megatron's grammar, pipeline_parallel/layout.h) that minimises the
// simulated step time of the pipeline schedule (pipeline_parallel/simulator.h), next to the even split's.
//
// Model: the items in model order are E (embedding), t_0 .. t_{n-1} (decoder layers), L (output layer + loss),
// each with a forward and a backward cost per microbatch (ms). A split puts a contiguous run of decoder layers on
// each of the S = pp * V stages in model order (stage k = (vp k / pp, rank k % pp), as layout.h), E on stage 0 and
// L on stage S-1; a stage may hold no decoder layer (Megatron's layouts allow it: "E|t*4|t*4|t*3,L"). A stage's
// forward (backward) cost = the sum of its items' + chunk_overhead (the per-action time no layer row covers). The
// simulator runs Megatron's schedule (1F1B, interleaved with V > 1) for M microbatches with those per-(rank, chunk)
// costs and P2P free; its makespan is the step time, its per-rank idle 1 - busy / makespan the bubble.
//
// Search: with at most exhaustive_limit splits (C(n + S - 1, S - 1)) every split is simulated (exact); otherwise
// the minimax split (dynamic programming: the least possible max stage cost F + B, exact) and the even split
// start a hill climb (d layers from one stage to another: any d between neighbours, up to 2 otherwise) while the
// simulated step time drops. Ties: the
// lower max stage, then the even split, then the earlier split in enumeration order.
//
// Costs come from a timeline (`mcpp train --timeline`'s layer rows, training/timeline.h; the first step left
// out as warm-up when there are more) or a costs file (JSON or CSV, format in docs/FEATURES.md "Pipeline layout planner"). Bad
// input (a missing / malformed file, a trace without layer rows, a gap in the layer indices, a negative cost,
// pp * V more than the layers) is an mcpp::Error naming the file or the field. Pure computation.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "mcpp/tools/trace_summary.h"

namespace mcpp::tools {

struct ItemCost {
  double forward_ms = 0, backward_ms = 0;
  double total() const { return forward_ms + backward_ms; }
};

struct LayerCosts {
  ItemCost embedding, loss;      // 'E', 'L' (output layer + loss)
  std::vector<ItemCost> layers;  // decoder layer i, [num_layers]
  ItemCost chunk_overhead;       // per Forward / Backward action, not in any layer row
  int64_t num_microbatches = 0;  // what the source says (0: unknown)
  int64_t measured_pp = 0;       // the traced run's pipeline size (0: unknown)
  std::string source;            // the file, for messages
};

// Decoder layers per stage in model order, [pp * V].
using Split = std::vector<int64_t>;

struct SplitEval {
  Split split;
  std::string layout;                 // Megatron's --pipeline-model-parallel-layout
  std::vector<double> rank_ms;        // per rank: forward + backward of one microbatch over its chunks [pp]
  double max_stage_ms = 0;            // max of rank_ms
  double step_ms = 0;                 // simulated makespan of one step (M microbatches)
  double bubble_slowest = 0;          // idle fraction of the busiest rank
  double bubble_mean = 0;             // mean idle fraction over ranks (bubble + imbalance)
};

struct LayoutPlanOptions {
  int64_t pipeline_model_parallel_size = 1;
  int64_t virtual_pipeline_model_parallel_size = 1;
  int64_t num_microbatches = 1;
  int64_t exhaustive_limit = 20000;  // splits simulated one by one at most; more: minimax + hill climb
};

struct LayoutPlan {
  bool has_even = false;  // num_layers divides by pp * V
  SplitEval even, proposal;
  int64_t candidates = 0;  // splits simulated
  bool exhaustive = false;
};

// Checks the costs and the options (names the field); the sizes the schedule needs (pipeline_parallel's
// validate_schedule_options).
void validate(const LayerCosts& costs, const LayoutPlanOptions& opt);

// Megatron's even split: n / (pp * V) layers on every stage; an mcpp::Error when it does not divide.
Split even_split(int64_t num_layers, int64_t pp, int64_t vpp);
// "E,t*3|t*4|t*4|t*3,L" (a stage with no item but 't' repeats, an empty stage is "").
std::string layout_string(const Split& split);
// The exact minimax split: the least max over stages of (F + B + 2 overheads); ties: the earliest boundaries.
Split minimax_split(const LayerCosts& costs, int64_t stages);
// One split simulated (validate() first).
SplitEval evaluate(const LayerCosts& costs, const Split& split, const LayoutPlanOptions& opt);
// The search (above).
LayoutPlan plan_layout(const LayerCosts& costs, const LayoutPlanOptions& opt);

// Per-layer costs from a timeline's layer rows, the first step left out when there are more: per microbatch, the
// fastest row of the item and pass x its rows per microbatch (the service time: descheduling on shared cores only
// stretches rows); L = output_layer + loss rows. chunk_overhead = per rank the median over its forward (backward) actions of
// the action's time outside the layer rows inside it, the mean over ranks.
LayerCosts layer_costs_from_trace(const Trace& trace, const std::string& source);
// A costs file: *.csv ("item,forward_ms,backward_ms" rows: embedding, loss, layer <i> or decoder.layers.<i>,
// overhead) or JSON ({"embedding": {"forward_ms", "backward_ms"}, "loss": {..}, "layers": [{..}, ..],
// "chunk_overhead": {..} (optional), "num_microbatches": M (optional)}).
LayerCosts read_layer_costs(const std::string& path);

std::string format_plan(const LayoutPlan& plan, const LayerCosts& costs, const LayoutPlanOptions& opt);

}  // namespace mcpp::tools
