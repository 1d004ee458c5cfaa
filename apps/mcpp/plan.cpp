// mcpp plan — launch planning without launching.
//   mcpp plan ranks --world N [--tp T] [--pp P] [--cp C] [--ep E] [--expert-tp X] [--order tp-cp-ep-dp-pp]
//     prints the layout line, one table row per rank (coordinates in the dense and expert grids, then the
//     index of the group it belongs to for every group kind, '-' for none), and every group per kind:
//       <kind> (<count> x <size>): [r0,r1] [r2,r3] ...
//     Pure rank arithmetic (parallel_state::ParallelLayout); no MPI. An invalid layout is an
//     mcpp::Error -> one "error: ..." line, exit 2.
//   mcpp plan memory --world N [--json] [--memory-budget-gib G] [every `mcpp train` flag / --config RECIPE.toml]
//     the memory plan of that training run (tools/memory_planner.h): per pipeline rank the parameters,
//     grads, main params and optimizer state (sharded with --use-distributed-optimizer), one microbatch's
//     activations per model chunk, the contexts in flight and the peak over the schedule; --json prints the
//     memory_plan record the trainer writes to its metrics. The config is checked as `mcpp train` checks it
//     (no data path needed); what the run would refuse is an "error: ..." line, exit 2. --memory-budget-gib G
//     (per GPU) adds whether the plan fits and the largest --micro-batch-size that fits, keeping the layout and
//     the number of microbatches (tools::fit_memory); with --json a "budget" object.
//   mcpp plan layout (--timeline TRACE.json | --layer-costs FILE) --pipeline-model-parallel-size P [...]
//     a --pipeline-model-parallel-layout from measured per-layer costs (apps/mcpp/plan_layout.cpp).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "apps/mcpp/command.h"
#include "apps/mcpp/plan_layout.h"
#include "apps/mcpp/tokenizer_flags.h"
#include "mcpp/core/error.h"
#include "mcpp/parallel_state/parallel_context.h"
#include "mcpp/tools/memory_planner.h"
#include "mcpp/training/arguments.h"

namespace {

using mcpp::parallel_state::GroupKind;
using mcpp::parallel_state::ParallelLayout;

void print_ranks(const ParallelLayout& L) {
  fmt::print("layout: world {} = tp {} x cp {} x dp {} x pp {} (order {}); expert grid: expert_tp {} x ep {} x "
             "expert_dp {} x pp {}\n",
             L.world_size(), L.tp(), L.cp(), L.dp(), L.pp(), L.order(), L.expert_tp(), L.ep(), L.expert_dp(), L.pp());
  const auto kinds = mcpp::parallel_state::all_group_kinds();
  std::vector<std::vector<std::vector<int>>> groups;
  for (GroupKind k : kinds) groups.push_back(L.groups(k));
  std::string head = fmt::format("{:>5} {:>3} {:>3} {:>3} {:>3} | {:>3} {:>3} {:>3} |", "rank", "tp", "cp", "dp", "pp",
                                 "etp", "ep", "edp");
  for (GroupKind k : kinds) head += fmt::format(" {:>9}", mcpp::parallel_state::group_kind_name(k));
  fmt::print("{}\n", head);
  for (int r = 0; r < L.world_size(); ++r) {
    const auto c = L.coordinates(r);
    std::string row = fmt::format("{:>5} {:>3} {:>3} {:>3} {:>3} | {:>3} {:>3} {:>3} |", r, c.tp, c.cp, c.dp, c.pp,
                                  c.expert_tp, c.ep, c.expert_dp);
    for (size_t i = 0; i < kinds.size(); ++i) {
      int idx = -1;
      for (size_t g = 0; g < groups[i].size() && idx < 0; ++g)
        for (int m : groups[i][g])
          if (m == r) idx = static_cast<int>(g);
      row += idx < 0 ? fmt::format(" {:>9}", "-") : fmt::format(" {:>9}", idx);
    }
    fmt::print("{}\n", row);
  }
  fmt::print("groups:\n");
  for (size_t i = 0; i < kinds.size(); ++i) {
    std::string line = fmt::format("{} ({} x {}):", mcpp::parallel_state::group_kind_name(kinds[i]), groups[i].size(),
                                   groups[i].front().size());
    for (const auto& g : groups[i]) line += fmt::format(" [{}]", fmt::join(g, ","));
    fmt::print("{}\n", line);
  }
}

// A flag's value as a positive number (integer: whole digits only); anything else names the flag.
template <class T>
T parse_positive(const std::string& flag, const std::string& v) {
  T x = 0;
  try {
    size_t used = 0;
    if constexpr (std::is_integral_v<T>) x = std::stoll(v, &used);
    else x = std::stod(v, &used);
    if (used != v.size()) x = 0;
  } catch (const std::exception&) {
    x = 0;
  }
  if (!(x > 0) || !std::isfinite(static_cast<double>(x)))
    mcpp::fail("plan memory: {} wants a positive number, got '{}'", flag, v);
  return x;
}

int run_plan_memory(const std::vector<std::string>& args) {
  int64_t world = 0;
  double budget_gib = 0;
  bool json = false;
  std::vector<std::string> train_args;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--json") {
      json = true;
    } else if (a == "--world" || a.starts_with("--world=")) {
      world = parse_positive<int64_t>("--world", a == "--world" ? (i + 1 < args.size() ? args[++i] : "") : a.substr(8));
    } else if (a == "--memory-budget-gib" || a.starts_with("--memory-budget-gib=")) {
      const std::string v = a == "--memory-budget-gib" ? (i + 1 < args.size() ? args[++i] : "") : a.substr(20);
      budget_gib = parse_positive<double>("--memory-budget-gib", v);
    } else if (a == "--help" || a == "-h") {
      fmt::print("mcpp plan memory --world N [--json] [--memory-budget-gib G] [mcpp train flags]: the memory plan "
                 "per pipeline rank; with a budget (GiB per GPU), whether it fits and the largest micro-batch size "
                 "that does\n");
      return 0;
    } else {
      train_args.push_back(a);
    }
  }
  if (world <= 0) mcpp::fail("plan memory: --world N (the number of ranks of the run) is required");
  mcpp::Config cfg = mcpp::parse_train_args(train_args);
  cfg.apply_world_size(world);
  mcpp::cli::apply_tokenizer(cfg);
  cfg.validate();
  mcpp::validate_parallel_layout(world, cfg);
  const mcpp::tools::MemoryPlan plan = mcpp::tools::plan_memory(cfg);
  nlohmann::json j = mcpp::tools::to_json(plan);
  std::string text = mcpp::tools::format_memory_plan(plan);
  if (budget_gib > 0) {
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    const mcpp::tools::MemoryFit fit = mcpp::tools::fit_memory(cfg, budget_gib * kGiB);
    j["budget"] = {{"gib", budget_gib},
                   {"fits", fit.fits},
                   {"largest_rank_bytes", fit.largest_rank_bytes},
                   {"max_micro_batch_size", fit.max_micro_batch_size}};
    text += fmt::format("memory budget {:g} GiB per GPU: the plan {} (largest rank {:.3f} GiB, before transient "
                        "buffers); ",
                        budget_gib, fit.fits ? "fits" : "does NOT fit", fit.largest_rank_bytes / kGiB);
    text += fit.max_micro_batch_size > 0
                ? fmt::format("the largest --micro-batch-size that fits, keeping {} microbatch(es) a step: {}\n",
                              plan.num_microbatches, fit.max_micro_batch_size)
                : std::string("not even --micro-batch-size 1 fits (model state or one sample's activations too "
                              "large: more tensor / pipeline parallelism, the distributed optimizer or recompute)\n");
  }
  if (json) fmt::print("{}\n", j.dump());
  else fmt::print("{}", text);
  return 0;
}

int run_plan(const std::vector<std::string>& args) {
  if (!args.empty() && args.front() == "memory")
    return run_plan_memory(std::vector<std::string>(args.begin() + 1, args.end()));
  if (!args.empty() && args.front() == "layout")
    return mcpp::cli::run_plan_layout(std::vector<std::string>(args.begin() + 1, args.end()));
  CLI::App app{"mcpp plan: launch planning (rank layouts; `mcpp plan memory --help`: the memory plan; `mcpp plan "
               "layout --help`: a pipeline layout from measured layer costs)",
               "mcpp plan"};
  app.require_subcommand(1);
  CLI::App* ranks = app.add_subcommand("ranks", "each rank's coordinates and groups (Megatron-Core's layout)");
  int64_t world = 0;
  mcpp::parallel_state::ParallelOptions opt;
  ranks->add_option("--world", world, "number of ranks")->required();
  ranks->add_option("--tp,--tensor-model-parallel-size", opt.tensor_model_parallel_size, "tensor parallel size");
  ranks->add_option("--pp,--pipeline-model-parallel-size", opt.pipeline_model_parallel_size, "pipeline parallel size");
  ranks->add_option("--cp,--context-parallel-size", opt.context_parallel_size, "context parallel size");
  ranks->add_option("--ep,--expert-model-parallel-size", opt.expert_model_parallel_size, "expert parallel size");
  ranks->add_option("--expert-tp,--expert-tensor-parallel-size", opt.expert_tensor_parallel_size,
                    "expert tensor parallel size (default: tp)");
  ranks->add_option("--order", opt.order, "rank order, fastest dimension first")->default_val(opt.order);
  std::vector<std::string> rev(args.rbegin(), args.rend());  // CLI11 parses a reversed vector
  try {
    app.parse(rev);
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    return 0;
  }
  if (*ranks) print_ranks(ParallelLayout::make(world, opt));
  return 0;
}

const mcpp::cli::Register reg{"plan",
                              "launch planning: `plan ranks` prints the parallel rank layout, `plan memory` the memory "
                              "plan of a training run, `plan layout` a pipeline layout from measured layer costs",
                              &run_plan};

}  // namespace
