// tools/memory_planner against what the code actually holds: for every model shape the planner claims to
// cover (GPT-2 / Llama style, packed / split / unfused attention, selective and full recompute, dropout,
// first / middle / last / whole pipeline stages, untied, GQA, MoE with sequential or grouped-GEMM experts, a stage
// without layers), a real training forward's context bytes (pipeline_parallel::context_bytes, each storage once)
// and the stage's parameter count equal the plan exactly. The schedule peak (in flight x chunk bytes over
// build_schedule) is compared with the formulas of schedules.h; the whole-run comparison (TP / SP / PP / VP under
// mpiexec, the trainer's measured pipeline_activation_memory record) is in
// tests/oracle/cli/{pipeline,parallel}_train_check.py.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <array>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mcpp/core/error.h"
#include "mcpp/distributed/model_chunk.h"
#include "mcpp/models/gpt/gpt_model.h"
#include "mcpp/pipeline_parallel/activation_memory.h"
#include "mcpp/pipeline_parallel/schedules.h"
#include "mcpp/tensor_parallel/random.h"
#include "mcpp/tools/memory_planner.h"
#include "tests/models/gpt_test_util.h"
#include "training/trainer_test_util.h"

namespace mcpp {
namespace {

struct Case {
  std::string name;
  std::string style;  // gpt2 | llama
  std::string attention = "flash";
  std::string recompute{}, method{};
  int64_t recompute_layers = 0;
  bool dropout = false;
  bool untied = false;
  bool no_rope = false;  // llama without RoPE: the packed flash path with SwiGLU / RMSNorm / GQA
  std::string moe_freq{};  // MoE: 4 experts, top-2, in the layers of this --moe-layer-freq
  int64_t shared = 0;      // MoE: the shared expert's width
  double capacity = 0.0;   // MoE: --moe-expert-capacity-factor, padded to capacity (the plan is exact then)
  std::vector<std::string> modules{"core_attn"};  // --recompute-modules (selective)
  bool shared_gate = false;                        // MoE: --moe-shared-expert-gate
  bool qk_layernorm = false;                       // --qk-layernorm
  int64_t mtp = 0;                                 // --mtp-num-layers
  bool rope = false;                               // gpt2 with RoPE (MTP needs RoPE or no positions)
  bool per_token = false;                          // --calculate-per-token-loss
  std::string mla{};  // multi-latent attention: testing::mla_tiny_config of this style (llama | gpt2)
  bool grouped = false;  // MoE: --moe-grouped-gemm (GroupedMLP's context instead of SequentialMLP's)
  std::string fp8{};     // --fp8-format hybrid --fp8-recipe this (the CPU backend's emulated casts kept)
  bool fp8_first_last_bf16 = false;  // --first-last-layers-bf16
};

Config config_for(const Case& k) {
  Config cfg;
  cfg.model = k.mla.empty() ? testing::tiny_config(k.style) : testing::mla_tiny_config(k.mla);
  cfg.model.num_layers = 4;
  cfg.model.attention_impl = k.attention;
  cfg.model.recompute_granularity = k.recompute;
  cfg.model.recompute_method = k.method;
  cfg.model.recompute_num_layers = k.recompute_layers;
  cfg.model.recompute_modules = k.modules;
  if (k.dropout) cfg.model.hidden_dropout = 0.1f, cfg.model.attention_dropout = 0.1f;
  if (k.untied) cfg.model.untie_embeddings_and_output_weights = true;
  if (k.no_rope) cfg.model.position_embedding_type = PositionEmbedding::None;
  cfg.model.qk_layernorm = k.qk_layernorm;
  cfg.model.mtp_num_layers = k.mtp;
  if (k.rope) cfg.model.position_embedding_type = PositionEmbedding::Rope;
  cfg.model.calculate_per_token_loss = k.per_token;
  if (!k.moe_freq.empty()) {
    cfg.model.num_moe_experts = 4;
    cfg.model.moe_layer_freq = k.moe_freq;
    cfg.model.moe_shared_expert_intermediate_size = k.shared;
    cfg.model.moe_shared_expert_gate = k.shared_gate;
    cfg.model.moe_expert_capacity_factor = k.capacity;
    cfg.model.moe_pad_expert_input_to_capacity = k.capacity > 0;
    cfg.model.moe_grouped_gemm = k.grouped;
  }
  if (!k.fp8.empty()) {
    cfg.model.fp8_format = "hybrid";
    cfg.model.fp8_recipe = k.fp8;
    cfg.model.fp8_amax_history_len = 4;
    cfg.model.first_last_layers_bf16 = k.fp8_first_last_bf16;
  }
  cfg.training.micro_batch_size = 3;
  cfg.training.device = "cpu";  // the plan of the CPU backend's contexts (its FP8 casts: float32)
  cfg.finalize();
  return cfg;
}

TEST(MemoryPlanner, ContextBytesAndParamsEqualARealForwardOfEveryStage) {
  const std::vector<Case> cases = {
      {.name = "gpt2 packed flash", .style = "gpt2"},
      {.name = "gpt2 unfused + dropout", .style = "gpt2", .attention = "unfused", .dropout = true},
      {.name = "gpt2 untied", .style = "gpt2", .untied = true},
      {.name = "llama rope flash (split q/k/v)", .style = "llama"},
      {.name = "llama no rope (packed, swiglu, gqa)", .style = "llama", .no_rope = true},
      {.name = "llama unfused + dropout", .style = "llama", .attention = "unfused", .dropout = true},
      {.name = "gpt2 selective", .style = "gpt2", .recompute = "selective", .dropout = true},
      {.name = "llama selective", .style = "llama", .recompute = "selective"},
      {.name = "gpt2 unfused selective", .style = "gpt2", .attention = "unfused", .recompute = "selective"},
      {.name = "gpt2 moe [1,0,0,1] + shared 40", .style = "gpt2", .moe_freq = "[1,0,0,1]", .shared = 40},
      {.name = "llama moe every 2nd + shared 24", .style = "llama", .moe_freq = "2", .shared = 24},
      {.name = "llama moe (1 layer in 4), full recompute", .style = "llama", .recompute = "full", .method = "uniform",
       .recompute_layers = 2, .moe_freq = "[0]*3+[1]"},
      {.name = "gpt2 moe capacity 0.6 padded", .style = "gpt2", .moe_freq = "1", .capacity = 0.6},
      {.name = "llama moe capacity 1.5 padded + shared", .style = "llama", .moe_freq = "2", .shared = 24,
       .capacity = 1.5},
      {.name = "gpt2 full uniform 1", .style = "gpt2", .recompute = "full", .method = "uniform", .recompute_layers = 1},
      {.name = "llama full uniform 3", .style = "llama", .recompute = "full", .method = "uniform",
       .recompute_layers = 3, .dropout = true},
      {.name = "gpt2 full block 2", .style = "gpt2", .recompute = "full", .method = "block", .recompute_layers = 2},
      // selective recompute of the MLP / MoE layer: only its input kept
      {.name = "gpt2 moe [1,0,0,1] selective mlp + moe", .style = "gpt2", .recompute = "selective", .dropout = true,
       .moe_freq = "[1,0,0,1]", .shared = 40, .modules = {"mlp", "moe"}},
      {.name = "llama moe every 2nd selective core_attn + moe", .style = "llama", .recompute = "selective",
       .moe_freq = "2", .capacity = 1.5, .modules = {"core_attn", "moe"}},
      {.name = "llama selective mlp", .style = "llama", .recompute = "selective", .modules = {"mlp"}},
      {.name = "gpt2 moe [1,0,0,1] + gated shared 40", .style = "gpt2", .moe_freq = "[1,0,0,1]", .shared = 40,
       .shared_gate = true},
      // moe_act: the routed experts' activation outputs dropped (GELU and SwiGLU experts)
      {.name = "gpt2 moe [1,0,0,1] selective moe_act", .style = "gpt2", .recompute = "selective",
       .moe_freq = "[1,0,0,1]", .modules = {"moe_act"}},
      {.name = "llama moe every 2nd selective core_attn + moe_act, capacity 1.5", .style = "llama",
       .recompute = "selective", .moe_freq = "2", .capacity = 1.5, .modules = {"core_attn", "moe_act"}},
      // shared_experts: the shared expert's context re-run (gated and not)
      {.name = "gpt2 moe [1,0,0,1] + gated shared 40, selective shared_experts", .style = "gpt2",
       .recompute = "selective", .moe_freq = "[1,0,0,1]", .shared = 40, .modules = {"shared_experts"},
       .shared_gate = true},
      {.name = "llama moe every 2nd + shared 24, selective shared_experts + moe_act", .style = "llama",
       .recompute = "selective", .moe_freq = "2", .shared = 24, .modules = {"shared_experts", "moe_act"}},
      // moe_grouped_gemm: GroupedMLP's pre_act / act over all the rows (dropless: the router's device counts;
      // padded: the plan's), with and without moe_act, GELU and SwiGLU experts
      {.name = "gpt2 moe [1,0,0,1] grouped gemm + shared 40", .style = "gpt2", .moe_freq = "[1,0,0,1]", .shared = 40,
       .grouped = true},
      {.name = "llama moe every 2nd grouped gemm, capacity 1.5 padded", .style = "llama", .moe_freq = "2",
       .capacity = 1.5, .grouped = true},
      {.name = "gpt2 moe grouped gemm, capacity 0.6 padded, selective moe_act", .style = "gpt2",
       .recompute = "selective", .moe_freq = "1", .capacity = 0.6, .modules = {"moe_act"}, .grouped = true},
      {.name = "llama moe every 2nd grouped gemm, selective core_attn + moe_act", .style = "llama",
       .recompute = "selective", .moe_freq = "2", .modules = {"core_attn", "moe_act"}, .grouped = true},
      {.name = "llama moe every 2nd grouped gemm + shared 24, selective moe", .style = "llama",
       .recompute = "selective", .moe_freq = "2", .shared = 24, .modules = {"moe"}, .grouped = true},
      // qk norms: the split q, k kept by the norms (with their statistics) besides the core's normalized q, k
      {.name = "gpt2 qk layernorm (no longer packed) + dropout", .style = "gpt2", .dropout = true,
       .qk_layernorm = true},
      {.name = "llama qk layernorm selective", .style = "llama", .recompute = "selective", .qk_layernorm = true},
      {.name = "llama qk layernorm unfused", .style = "llama", .attention = "unfused", .qk_layernorm = true},
      // layernorm: the norms' outputs kept nowhere (linear_qkv's / fc1's inputs, the router's, the shared expert's,
      // with mlp / moe the MLP's kept input)
      {.name = "gpt2 selective layernorm + dropout", .style = "gpt2", .recompute = "selective", .dropout = true,
       .modules = {"layernorm"}},
      {.name = "llama selective layernorm + core_attn + mlp, qk layernorm", .style = "llama",
       .recompute = "selective", .modules = {"layernorm", "core_attn", "mlp"}, .qk_layernorm = true},
      {.name = "gpt2 moe [1,0,0,1] + gated shared 40, selective layernorm", .style = "gpt2", .recompute = "selective",
       .moe_freq = "[1,0,0,1]", .shared = 40, .modules = {"layernorm"}, .shared_gate = true},
      {.name = "llama moe every 2nd + shared 24, selective layernorm + moe + shared_experts", .style = "llama",
       .recompute = "selective", .moe_freq = "2", .shared = 24, .modules = {"layernorm", "moe", "shared_experts"}},
      // multi-token prediction: the depths' contexts on the last stage (the embedding copy when untied)
      {.name = "llama mtp 2", .style = "llama", .mtp = 2},
      {.name = "llama mtp 2 unfused + dropout, per token", .style = "llama", .attention = "unfused", .dropout = true,
       .mtp = 2, .per_token = true},
      {.name = "gpt2 rope (tied) mtp 1 + dropout", .style = "gpt2", .dropout = true, .mtp = 1, .rope = true},
      {.name = "llama mtp 2 full uniform 2", .style = "llama", .recompute = "full", .method = "uniform",
       .recompute_layers = 2, .mtp = 2},
      {.name = "llama mtp 1 full block 1", .style = "llama", .recompute = "full", .method = "block",
       .recompute_layers = 1, .mtp = 1},
      {.name = "llama mtp 2 selective layernorm + mlp", .style = "llama", .recompute = "selective",
       .modules = {"layernorm", "mlp"}, .mtp = 2},
      {.name = "llama moe [0,0,0,1] + shared 24, mtp 2 (MoE depths)", .style = "llama", .moe_freq = "[0,0,0,1]",
       .shared = 24, .mtp = 2},
      // multi-latent attention: the latents (and their norms), query / key / value of the padded head dim, the
      // value channels' copy when the heads are padded
      {.name = "mla llama (q compression, values padded) + latent norms", .style = "llama", .qk_layernorm = true,
       .mla = "llama"},
      {.name = "mla gpt2 (queries / keys padded) + latent norms + dropout", .style = "gpt2", .dropout = true,
       .qk_layernorm = true, .mla = "gpt2"},
      {.name = "mla llama unfused, no latent norms", .style = "llama", .attention = "unfused", .mla = "llama"},
      {.name = "mla llama selective core_attn + latent norms", .style = "llama", .recompute = "selective",
       .qk_layernorm = true, .mla = "llama"},
      {.name = "mla gpt2 selective layernorm + core_attn", .style = "gpt2", .recompute = "selective",
       .modules = {"layernorm", "core_attn"}, .qk_layernorm = true, .mla = "gpt2"},
      {.name = "mla llama full uniform 2", .style = "llama", .recompute = "full", .method = "uniform",
       .recompute_layers = 2, .qk_layernorm = true, .mla = "llama"},
      {.name = "mla llama mtp 2", .style = "llama", .qk_layernorm = true, .mtp = 2, .mla = "llama"},
      {.name = "mla llama selective mla_up_proj", .style = "llama", .recompute = "selective",
       .modules = {"mla_up_proj"}, .qk_layernorm = true, .mla = "llama"},
      {.name = "mla gpt2 unfused selective mla_up_proj + core_attn + layernorm", .style = "gpt2",
       .attention = "unfused", .recompute = "selective", .modules = {"mla_up_proj", "core_attn", "layernorm"},
       .mla = "gpt2"},
      // FP8: a per-tensor linear keeps its casts (ops.h Fp8Saved) instead of its input (blockwise keeps the input and
      // needs dimensions of 128: the shapes without FP8 above)
      {.name = "gpt2 fp8 delayed", .style = "gpt2", .fp8 = "delayed"},
      {.name = "gpt2 fp8 tensorwise + dropout", .style = "gpt2", .dropout = true, .fp8 = "tensorwise"},
      {.name = "llama fp8 delayed", .style = "llama", .fp8 = "delayed"},
      {.name = "gpt2 fp8 delayed, first / last layers bf16", .style = "gpt2", .fp8 = "delayed",
       .fp8_first_last_bf16 = true},
      {.name = "gpt2 fp8 delayed unfused, selective layernorm", .style = "gpt2", .attention = "unfused",
       .recompute = "selective", .modules = {"layernorm"}, .fp8 = "delayed"},
      {.name = "llama fp8 delayed full uniform 2", .style = "llama", .recompute = "full", .method = "uniform",
       .recompute_layers = 2, .fp8 = "delayed"},
      {.name = "llama moe every 2nd + shared 24, fp8 delayed", .style = "llama", .moe_freq = "2", .shared = 24,
       .fp8 = "delayed"},
      {.name = "mla llama fp8 delayed (values padded)", .style = "llama", .qk_layernorm = true, .mla = "llama",
       .fp8 = "delayed"},
      {.name = "mla gpt2 fp8 delayed (flash's output is linear_proj's input)", .style = "gpt2", .mla = "gpt2",
       .fp8 = "delayed"},
      {.name = "mla gpt2 fp8 delayed unfused", .style = "gpt2", .attention = "unfused", .mla = "gpt2",
       .fp8 = "delayed"},
  };
  struct StageCase {
    bool pre, post;
    int64_t first, count;
  };
  const std::vector<StageCase> stages = {{true, true, 0, 4},  {true, false, 0, 2}, {false, false, 1, 2},
                                         {false, true, 2, 2}, {true, false, 0, 0}, {false, true, 4, 0}};
  for (const Case& k : cases) {
    const Config cfg = config_for(k);
    for (const StageCase& sc : stages) {
      const std::string where = fmt::format("{}: stage pre={} post={} layers [{}, {})", k.name, sc.pre, sc.post,
                                            sc.first, sc.first + sc.count);
      ModelChunk model(cfg.model, 3, testing::single_tp(), Device::CPU,
                     {.pre_process = sc.pre, .post_process = sc.post, .first_layer = sc.first, .num_layers = sc.count});
      std::vector<int64_t> layers;
      for (int64_t i = 0; i < sc.count; ++i) layers.push_back(sc.first + i);
      EXPECT_EQ(tools::chunk_params(cfg, layers, sc.pre, sc.post), model.params().numel()) << where;
      EXPECT_EQ(tools::chunk_expert_params(cfg, layers, sc.post),
                model.has_expert_params() ? model.expert_params().numel() : 0) << where;
      tensor_parallel::RngTracker rng(9, 0, 0);
      MtpLossTracker mtp_losses(cfg.model.mtp_num_layers);
      const ForwardOptions opt{.training = true, .rng = &rng, .mtp_losses = &mtp_losses};
      const int64_t s = cfg.model.seq_length, b = cfg.training.micro_batch_size, h = cfg.model.hidden_size;
      testing::Batch bt = testing::fixed_batch(s, b, cfg.model.vocab_size);
      Tensor input;
      if (!sc.pre) {
        input = Tensor::empty({s, b, h});
        for (int64_t i = 0; i < input.numel(); ++i) input.data<float>()[i] = 0.01f * static_cast<float>(i % 17);
      }
      GPTModelCtx ctx;
      LossResult loss;
      model.forward_step(ctx, bt.tokens, input, sc.post ? bt.labels : Tensor(), sc.post ? bt.loss_mask : Tensor(),
                         opt, sc.post ? &loss : nullptr);
      EXPECT_EQ(tools::chunk_context_bytes(cfg, layers, sc.pre, sc.post),
                static_cast<int64_t>(pipeline_parallel::context_bytes(ctx)))
          << where;
    }
  }
}

Config plan_config(int64_t pp, int64_t vp_layers, int64_t global_batch, int64_t world) {
  Config cfg;
  cfg.model = testing::tiny_config("gpt2");
  cfg.model.num_layers = 8;
  cfg.parallel.pipeline_model_parallel_size = pp;
  cfg.parallel.num_layers_per_virtual_pipeline_stage = vp_layers;
  cfg.training.micro_batch_size = 2;
  cfg.training.global_batch_size = global_batch;
  cfg.finalize();
  cfg.apply_world_size(world);
  return cfg;
}

// The schedule peak: 1F1B holds min(pp - rank, M) identical contexts (the last stage's larger); interleaving
// holds schedules.h's max_activations_in_flight; the model state is memory_report()'s bytes per parameter.
TEST(MemoryPlanner, SchedulePeakFollowsTheScheduleAndModelStateTheBytesPerParameter) {
  for (const auto& [pp, vp_layers, gbs, world] : std::vector<std::array<int64_t, 4>>{
           {1, 0, 8, 1}, {2, 0, 16, 2}, {4, 0, 4, 4}, {4, 0, 32, 8}, {4, 1, 16, 4}, {4, 1, 8, 4}}) {
    const Config cfg = plan_config(pp, vp_layers, gbs, world);
    const tools::MemoryPlan plan = tools::plan_memory(cfg);
    ASSERT_EQ(static_cast<int64_t>(plan.stages.size()), pp);
    const int64_t vp = vp_layers > 0 ? 8 / pp / vp_layers : 1;
    EXPECT_EQ(plan.vp, vp);
    int64_t total = 0;
    for (const tools::StageMemory& st : plan.stages) {
      const std::string where = fmt::format("pp {} vp {} M {} rank {}", pp, vp, plan.num_microbatches, st.pp_rank);
      const pipeline_parallel::ScheduleOptions so{.pipeline_model_parallel_size = pp,
                                                  .pipeline_model_parallel_rank = st.pp_rank,
                                                  .num_microbatches = plan.num_microbatches,
                                                  .virtual_pipeline_model_parallel_size = vp};
      EXPECT_EQ(st.in_flight, pipeline_parallel::max_activations_in_flight(so)) << where;
      ASSERT_EQ(static_cast<int64_t>(st.chunks.size()), vp) << where;
      if (vp == 1) {
        EXPECT_EQ(st.peak_activation_bytes, st.in_flight * st.chunks[0].context_bytes) << where;
      }
      int64_t largest = 0;
      for (const tools::ChunkMemory& c : st.chunks) largest = std::max(largest, c.context_bytes);
      EXPECT_LE(st.peak_activation_bytes, st.in_flight * largest) << where;
      EXPECT_GT(st.peak_activation_bytes, 0) << where;
      EXPECT_EQ(st.param_bytes, 4.0 * static_cast<double>(st.params)) << where;  // fp32 params
      EXPECT_EQ(st.optimizer_state_bytes, 8.0 * static_cast<double>(st.params)) << where;
      total += st.params;
    }
    // The whole model once: a pp > 1 run's last stage holds a copy of the tied word embeddings.
    const int64_t copy = pp > 1 ? cfg.model.padded_vocab_size * cfg.model.hidden_size : 0;
    EXPECT_EQ(plan.total_params, total - copy);
    ModelChunk whole(cfg.model, 3, testing::single_tp());
    EXPECT_EQ(plan.total_params, whole.params().numel());
  }
}

TEST(MemoryPlanner, DistributedOptimizerShardsTheOptimizerOverDataParallelRanks) {
  Config cfg = plan_config(1, 0, 8, 4);
  cfg.parallel.use_distributed_optimizer = true;
  cfg.training.bf16 = true;
  const tools::MemoryPlan plan = tools::plan_memory(cfg);
  const auto p = static_cast<double>(plan.stages[0].params);
  EXPECT_EQ(plan.dp, 4);
  EXPECT_EQ(plan.stages[0].param_bytes, 2.0 * p);
  EXPECT_EQ(plan.stages[0].grad_bytes, 4.0 * p);
  EXPECT_EQ(plan.stages[0].main_param_bytes, 1.0 * p);       // 4 bytes / dp
  EXPECT_EQ(plan.stages[0].optimizer_state_bytes, 2.0 * p);  // 8 bytes / dp
  // bf16 activations: every activation term halves except the fp32 ones (norm statistics, lse, token ids,
  // labels, loss mask): strictly between half and all of the fp32 plan.
  Config f32 = cfg;
  f32.training.bf16 = false;
  const int64_t a16 = tools::plan_memory(cfg).stages[0].chunks[0].context_bytes;
  const int64_t a32 = tools::plan_memory(f32).stages[0].chunks[0].context_bytes;
  EXPECT_GT(a16, a32 / 2);
  EXPECT_LT(a16, a32);
  const nlohmann::json j = tools::to_json(plan);
  EXPECT_EQ(j["event"], "memory_plan");
  EXPECT_EQ(j["stages"][0]["params"].get<int64_t>(), plan.stages[0].params);
  EXPECT_NE(tools::format_memory_plan(plan).find("largest: pp rank 0"), std::string::npos);
  EXPECT_NE(tools::format_memory_plan(plan).find("MiB |"), std::string::npos);  // a small plan in MiB
  EXPECT_EQ(tools::format_bytes(1.5 * (1 << 30)), "1.500 GiB");
  EXPECT_EQ(tools::format_bytes(3.25 * (1 << 20)), "3.250 MiB");
}

// The capacity question: the largest micro-batch size whose plan fits a budget is found exactly at the
// boundary (a budget of exactly the plan at mbs k gives k, one byte less gives k - 1), keeping M.
TEST(MemoryPlanner, FitFindsTheLargestMicroBatchSizeWithinABudget) {
  const Config cfg = plan_config(4, 0, 32, 8);  // pp 4, dp 2, mbs 2 -> M = 8
  ASSERT_EQ(cfg.num_microbatches(), 8);
  const double now = tools::largest_rank_bytes(tools::plan_memory(cfg));
  for (const int64_t k : {1, 3, 7, 64}) {
    Config at = cfg;
    at.training.micro_batch_size = k;
    at.training.global_batch_size = k * 2 * 8;
    const double b = tools::largest_rank_bytes(tools::plan_memory(at));
    EXPECT_EQ(tools::fit_memory(cfg, b).max_micro_batch_size, k);
    EXPECT_EQ(tools::fit_memory(cfg, b - 1).max_micro_batch_size, k - 1);
    EXPECT_EQ(tools::fit_memory(cfg, b).fits, now <= b) << k;
  }
  const tools::MemoryFit none = tools::fit_memory(cfg, 1024.0);
  EXPECT_FALSE(none.fits);
  EXPECT_EQ(none.max_micro_batch_size, 0);
  EXPECT_EQ(none.largest_rank_bytes, now);
  EXPECT_THROW(tools::fit_memory(cfg, 0.0), Error);
}

// The trainer's check on a GPU: a rank whose plan exceeds the device is an error naming the rank, the sizes
// and the micro-batch size that would fit; a plan that fits passes.
TEST(MemoryPlanner, RequireFitsNamesTheRankAndTheMicroBatchThatFits) {
  Config cfg = plan_config(4, 0, 32, 8);
  cfg.training.micro_batch_size = 4;
  cfg.training.global_batch_size = 4 * 2 * 8;
  const tools::MemoryPlan plan = tools::plan_memory(cfg);
  Config half = cfg;
  half.training.micro_batch_size = 2;
  half.training.global_batch_size = 2 * 2 * 8;
  const double device = tools::largest_rank_bytes(tools::plan_memory(half));  // fits mbs 2, not 3
  int64_t refused = -1;
  for (const tools::StageMemory& st : plan.stages) {
    if (st.total_bytes() <= device) {
      EXPECT_NO_THROW(tools::require_fits(cfg, plan, st.pp_rank, device, "the GPU")) << st.pp_rank;
      continue;
    }
    refused = st.pp_rank;
    try {
      tools::require_fits(cfg, plan, st.pp_rank, device, "the GPU");
      ADD_FAILURE() << "rank " << st.pp_rank << " does not fit but passed";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(fmt::format("pipeline rank {} needs", st.pp_rank)), std::string::npos) << msg;
      EXPECT_NE(msg.find("--micro-batch-size 2 would fit (now 4)"), std::string::npos) << msg;
      EXPECT_NE(msg.find("but the GPU has"), std::string::npos) << msg;
    }
  }
  EXPECT_GE(refused, 0) << "some rank must exceed a budget sized for half the micro-batch";
  for (const tools::StageMemory& st : plan.stages)
    EXPECT_NO_THROW(tools::require_fits(cfg, plan, st.pp_rank, tools::largest_rank_bytes(plan), "the GPU"));
}

TEST(MemoryPlanner, RefusesWhatItDoesNotPlanNamingIt) {
  Config cfg = plan_config(1, 0, 8, 1);
  cfg.model.padded_vocab_size = 0;
  using training_test::error_of;
  EXPECT_NE(error_of([&] { tools::plan_memory(cfg); }).find("padded_vocab_size"), std::string::npos);
  Config ep = plan_config(1, 0, 8, 2);
  ep.parallel.expert_model_parallel_size = 2;
  EXPECT_NE(error_of([&] { tools::plan_memory(ep); }).find("expert_model_parallel_size 2"), std::string::npos);
}

// Context parallelism (all-to-all attention): the plan is that of s / cp rows on every rank, plus the flash
// core's kept output (a second [s/cp, b, np*hn] tensor: its hp2cp copy is linear_proj's input), and the
// optimizer shards over dp x cp. Measured against real CP ranks in training.context_parallel_cli.
TEST(MemoryPlanner, ContextParallelPlansTheRanksRows) {
  Config cp2 = plan_config(1, 0, 8, 2);
  cp2.parallel.context_parallel_size = 2;
  cp2.parallel.use_distributed_optimizer = true;
  cp2.apply_world_size(2);
  Config half = plan_config(1, 0, 8, 1);
  half.model.seq_length /= 2;
  const tools::MemoryPlan a = tools::plan_memory(cp2), b = tools::plan_memory(half);
  EXPECT_EQ(a.cp, 2);
  EXPECT_EQ(a.dp, 1);
  const auto& m = cp2.model;
  const int64_t context = (m.seq_length / 2) * cp2.training.micro_batch_size * m.num_attention_heads * m.head_dim() *
                          static_cast<int64_t>(dtype_size(cp2.training.bf16 ? DType::BF16 : DType::F32));
  ASSERT_EQ(m.attention_impl, "flash");
  EXPECT_EQ(a.stages[0].chunks[0].context_bytes, b.stages[0].chunks[0].context_bytes + m.num_layers * context);
  EXPECT_EQ(a.stages[0].optimizer_state_bytes, 4.0 * static_cast<double>(a.stages[0].params));  // 8 bytes / (dp*cp)
}

}  // namespace
}  // namespace mcpp
