// mcpp plan layout — a pipeline layout from measured per-layer costs (tools/layout_planner.h, experiment E06).
//   mcpp plan layout (--timeline TRACE.json | --layer-costs FILE) --pipeline-model-parallel-size P
//                    [--virtual-pipeline-model-parallel-size V] [--num-microbatches M] [--json]
// prints the costs it read, the even split's and the proposal's max stage time, simulated step time and bubble,
// and the flags to train with. M defaults to the source's (the trace's num_microbatches, the costs file's
// "num_microbatches"); --json prints {"even": .., "proposal": .., "candidates", "exhaustive"} instead. Bad input
// (a missing file, a trace without layer rows, P x V beyond the layers, a bad flag) is one "error: ..." line, exit 2.
#include "apps/mcpp/plan_layout.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "mcpp/core/error.h"
#include "mcpp/tools/layout_planner.h"
#include "mcpp/tools/trace_summary.h"

namespace mcpp::cli {

namespace {

int64_t parse_int(const std::string& flag, const std::string& v) {
  int64_t x = 0;
  size_t used = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size() || x < 1) fail("plan layout: {} wants a positive integer, got '{}'", flag, v);
  return x;
}

nlohmann::json to_json(const tools::SplitEval& e) {
  return {{"layout", e.layout},     {"layers_per_stage", e.split}, {"rank_ms", e.rank_ms},
          {"max_stage_ms", e.max_stage_ms}, {"step_ms", e.step_ms}, {"bubble_slowest", e.bubble_slowest},
          {"bubble_mean", e.bubble_mean}};
}

}  // namespace

int run_plan_layout(const std::vector<std::string>& args) {
  std::string timeline, costs_file;
  tools::LayoutPlanOptions opt;
  opt.pipeline_model_parallel_size = 0;
  opt.num_microbatches = 0;
  bool json = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) fail("plan layout: {} needs a value", a);
      return args[++i];
    };
    if (a == "--timeline") timeline = value();
    else if (a == "--layer-costs") costs_file = value();
    else if (a == "--pipeline-model-parallel-size" || a == "--pp") opt.pipeline_model_parallel_size = parse_int(a, value());
    else if (a == "--virtual-pipeline-model-parallel-size" || a == "--vpp")
      opt.virtual_pipeline_model_parallel_size = parse_int(a, value());
    else if (a == "--num-microbatches") opt.num_microbatches = parse_int(a, value());
    else if (a == "--json") json = true;
    else if (a == "--help" || a == "-h") {
      fmt::print("mcpp plan layout (--timeline TRACE.json | --layer-costs FILE) --pipeline-model-parallel-size P "
                 "[--virtual-pipeline-model-parallel-size V] [--num-microbatches M] [--json]: the "
                 "--pipeline-model-parallel-layout that minimises the simulated step time for measured per-layer "
                 "costs, next to the even split (docs/FEATURES.md#pipeline-layout-planner)\n");
      return 0;
    } else {
      fail("plan layout: unknown argument '{}' (see `mcpp plan layout --help`)", a);
    }
  }
  if (timeline.empty() == costs_file.empty())
    fail("plan layout: give exactly one of --timeline TRACE.json and --layer-costs FILE");
  if (opt.pipeline_model_parallel_size == 0) fail("plan layout: --pipeline-model-parallel-size P is required");
  const tools::LayerCosts costs = timeline.empty()
                                      ? tools::read_layer_costs(costs_file)
                                      : tools::layer_costs_from_trace(tools::read_trace(timeline), timeline);
  if (opt.num_microbatches == 0) opt.num_microbatches = costs.num_microbatches;
  if (opt.num_microbatches == 0)
    fail("plan layout: {} does not say the number of microbatches: pass --num-microbatches M", costs.source);
  const tools::LayoutPlan plan = tools::plan_layout(costs, opt);
  if (json) {
    nlohmann::json j{{"proposal", to_json(plan.proposal)}, {"candidates", plan.candidates},
                     {"exhaustive", plan.exhaustive}, {"num_microbatches", opt.num_microbatches},
                     {"pipeline_model_parallel_size", opt.pipeline_model_parallel_size},
                     {"virtual_pipeline_model_parallel_size", opt.virtual_pipeline_model_parallel_size}};
    j["even"] = plan.has_even ? to_json(plan.even) : nlohmann::json(nullptr);
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("{}", tools::format_plan(plan, costs, opt));
  }
  return 0;
}

}  // namespace mcpp::cli
