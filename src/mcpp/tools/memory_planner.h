// The memory planner (DESIGN decision 5: "peak memory is predictable — the planner computes it and tests
// compare"): per pipeline rank, the bytes a training run will hold, computed from the config alone (no model
// is built, nothing is allocated), so a layout can be checked before a job is launched (`mcpp plan memory`).
//
// Per pipeline rank (every TP / DP rank of it holds the same amounts; DP shards only the optimizer):
//   model state — the numel of this TP rank's parameters over its model chunks (the layout of
//     pipeline_parallel/layout.h: embedding on the first stage, final norm + output layer on the last, a
//     shared copy of the tied word embeddings there when pp > 1), times the bytes per parameter of Megatron's
//     distributed-optimizer table (optimizer/memory_report(), what this code allocates): params (the model
//     dtype) + fp32 main grads + fp32 main params (mixed precision) + Adam's two fp32 moments, the last two
//     / dp with the distributed optimizer (its bucket padding, < dp elements per bucket, is left out).
//   activations — each model chunk's per-microbatch context bytes, exactly what
//     pipeline_parallel::context_bytes() counts after that chunk's forward (each storage once), and the peak
//     over this rank's schedule (pipeline_parallel::build_schedule) of the live contexts: a forward adds its
//     chunk's bytes, a backward frees them. 1F1B holds min(pp - rank, M) microbatches; interleaving more.
// Per layer the modules' own formulas, each next to its forward (TransformerLayer / SelfAttention /
// MLASelfAttention / MLP / MoELayer / MultiTokenPredictionLayer::saved_bytes over transformer/activation_dims.h:
// n = s*b rows, n_l = n / tp under SP, e the activation dtype's bytes). Under EP the MoE rows a rank's experts receive
// depend on the routing and the plan assumes them balanced; expert parameters are E / ep per layer, their state
// sharded by the distributed optimizer over expert-DP (tp * dp * cp / ep).
// Full recompute keeps a group's input only (n_l*h*e; for a group starting at the stage's first layer that is
// the stage input). A chunk adds: the token ids n*4; the stage input n_l*h*e (received, or the embedding's
// output); on the last stage the final norm (n_l*h*e + stats), the output layer's input n*h*e, logits
// n*Vp/tp*e, labels + loss mask + lse 3*n*4 and the loss statistics (8 bytes); with MTP each depth's own
// (MultiTokenPredictionLayer::saved_bytes).
// Not planned: transient buffers of a backward step (activation grads, GEMM / attention workspaces), the
// CUDA caching allocator's rounding, communication buffers and the CUDA context — the measured device peak is
// above the plan by those (docs/PERF.md "Memory planner" has the H200 figures).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "mcpp/core/dtype.h"
#include "mcpp/optimizer/distributed_optimizer.h"
#include "mcpp/parallel_state/parallel_config.h"
#include "mcpp/transformer/transformer_config.h"

namespace mcpp::tools {

// What the planner reads of a run's configuration: the model, the parallel layout (data_parallel_size set:
// Config::apply_world_size), the micro and global batch and the param dtype. training/config.h's Config converts to
// it (implicitly: plan_memory(cfg) with a Config reads as it did).
struct PlanConfig {
  TransformerConfig model;
  ParallelConfig parallel;
  int64_t micro_batch_size = 1;
  int64_t global_batch_size = 0;
  bool bf16 = false;  // bf16 params and activations (--bf16), else fp32
  Device device = Device::CPU;  // where the run's activations live (--device): the FP8 casts' format
  // global / (micro * dp); mcpp::Error while data_parallel_size or global_batch_size is unknown.
  int64_t num_microbatches() const;
};

struct ChunkMemory {
  int64_t vp_stage = 0;
  bool pre_process = false, post_process = false;
  std::vector<int64_t> layers;  // global decoder-layer indices
  int64_t params = 0;           // numel of this TP rank's parameters in this chunk (MoE experts excluded)
  int64_t expert_params = 0;    // numel of this EP rank's MoE experts in this chunk
  int64_t context_bytes = 0;    // one microbatch's saved activations (pipeline_parallel::context_bytes)
};

struct StageMemory {
  int64_t pp_rank = 0;
  std::vector<ChunkMemory> chunks;
  int64_t params = 0;  // over the chunks
  int64_t expert_params = 0;  // over the chunks
  double param_bytes = 0, grad_bytes = 0, main_param_bytes = 0, optimizer_state_bytes = 0;
  int64_t in_flight = 0;              // peak live (microbatch, chunk) contexts over the schedule
  int64_t peak_activation_bytes = 0;  // peak live context bytes over the schedule
  double model_state_bytes() const { return param_bytes + grad_bytes + main_param_bytes + optimizer_state_bytes; }
  double total_bytes() const { return model_state_bytes() + static_cast<double>(peak_activation_bytes); }
};

struct MemoryPlan {
  int64_t world_size = 1, tp = 1, pp = 1, dp = 1, cp = 1, vp = 1, num_microbatches = 1;
  int64_t ep = 1, etp = 1, num_moe_experts = 0;  // expert model / tensor parallel sizes
  int64_t micro_batch_size = 1, seq_length = 1;
  bool distributed_optimizer = false, sequence_parallel = false;
  DType param_dtype = DType::F32;
  int64_t total_params = 0;  // the whole model (every TP rank, every stage; shared embedding copies once)
  std::vector<StageMemory> stages;  // [pp]
};

// cfg: parsed and finalized, with apply_world_size() and the vocabulary applied (padded_vocab_size > 0).
// Throws mcpp::Error naming the field for what a training run would refuse (layout, divisibility).
MemoryPlan plan_memory(const PlanConfig& cfg);

// Capacity: does the plan fit a per-GPU budget, and the largest micro-batch size that would, keeping the
// layout and the number of microbatches (so the global batch grows with it: mbs * dp * M). A plan's largest
// rank decides. max_micro_batch_size 0: not even one sample fits (the model state alone, or one sample's
// activations, exceed the budget). Searched up to 1 << 20.
struct MemoryFit {
  double budget_bytes = 0;
  double largest_rank_bytes = 0;  // of the given config
  bool fits = false;
  int64_t max_micro_batch_size = 0;
};
MemoryFit fit_memory(const PlanConfig& cfg, double budget_bytes);
// The trainer's check before it allocates anything (on a GPU against the device, on CPU ranks against this rank's
// share of the host memory): the plan is a lower bound of the peak (exact activations and model state; transient
// buffers come on top), so a pipeline rank whose plan exceeds the memory would run out of it — or, on the host,
// swap for minutes. Throws mcpp::Error naming the rank, the plan, `memory_name` ("the GPU", "this rank's share of
// the host") with its size and the largest --micro-batch-size that fits (fit_memory), with the other ways out.
void require_fits(const PlanConfig& cfg, const MemoryPlan& plan, int64_t pp_rank, double device_bytes,
                  const std::string& memory_name);
double largest_rank_bytes(const MemoryPlan& plan);

// One microbatch's context bytes of a chunk (the formula above); exposed for the tests.
int64_t chunk_context_bytes(const PlanConfig& cfg, const std::vector<int64_t>& layers, bool pre_process,
                            bool post_process);
// This TP rank's parameter numel of a chunk of the given global layers (rank-independent: every TP rank holds the
// same count), MoE experts excluded; chunk_expert_params: this EP rank's experts (num_moe_experts / ep per MoE
// layer).
int64_t chunk_params(const PlanConfig& cfg, const std::vector<int64_t>& layers, bool pre_process, bool post_process);
// post_process: with MTP depths of a MoE kind (the decoder's last layer's), their experts too.
int64_t chunk_expert_params(const PlanConfig& cfg, const std::vector<int64_t>& layers, bool post_process = false);

// "1.234 GiB", or "12.345 MiB" below 1 GiB.
std::string format_bytes(double bytes);
// A table per pipeline rank, in GiB (MiB for plans under 1 GiB), and the largest rank's total.
std::string format_memory_plan(const MemoryPlan& plan);
nlohmann::json to_json(const MemoryPlan& plan);

}  // namespace mcpp::tools
