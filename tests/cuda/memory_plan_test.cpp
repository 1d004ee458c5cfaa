// tools/memory_planner on the CUDA path: the activations a training forward of the GPT on the GPU keeps
// (pipeline_parallel::context_bytes of its context: cuBLASLt GELU epilogue outputs, cuDNN / mcpp flash
// attention's out + lse on the packed or split qkv, device copies of labels and loss mask) equal the plan's
// bytes for the same config, bf16 (mixed precision) and fp32, with and without recompute (selective also with the
// norms' and the MLP's re-run), and for MoE layers whose experts run as grouped GEMMs (dropless: sized by the
// router's device counts; padded to capacity), and FP8 linears' kept casts — the figures `mcpp plan memory` reports for a GPU run (docs/PERF.md
// "Memory planner" compares the device peak).
#include "cuda/cuda_test_util.h"
#include "mcpp/distributed/model_chunk.h"
#include "mcpp/models/gpt/gpt_model.h"
#include "mcpp/pipeline_parallel/activation_memory.h"
#include "mcpp/tensor_parallel/random.h"
#include "mcpp/tools/memory_planner.h"
#include "mcpp/training/trainer.h"
#include "models/gpt_test_util.h"
#include "training/trainer_test_util.h"

namespace mcpp::cuda_test {
namespace {

TEST(CudaMemoryPlan, ContextBytesOfAGpuForwardEqualThePlan) {
  MCPP_REQUIRE_CUDA();
  for (const std::string style : {"gpt2", "llama", "llama packed"})
    for (const DType dt : float_dtypes())
      for (const std::string recompute : {"", "selective", "selective layernorm", "full"}) {
        SCOPED_TRACE(style + " " + std::string(dtype_name(dt)) + " recompute '" + recompute + "'");
        Config cfg;
        cfg.model = testing::tiny_gpu_config(style.starts_with("gpt2") ? "gpt2" : "llama");
        if (style.ends_with("packed")) cfg.model.position_embedding_type = PositionEmbedding::None;
        cfg.model.num_layers = 3;
        cfg.model.hidden_dropout = cfg.model.attention_dropout = 0.1f;
        cfg.model.recompute_granularity = recompute.substr(0, recompute.find(' '));
        if (recompute.ends_with("layernorm")) cfg.model.recompute_modules = {"core_attn", "layernorm", "mlp"};
        if (recompute == "full") cfg.model.recompute_method = "uniform", cfg.model.recompute_num_layers = 2;
        cfg.training.micro_batch_size = 3;
        cfg.training.bf16 = dt == DType::BF16;
        cfg.finalize();
        ModelChunk model(cfg.model, 1234, testing::single_tp(), Device::CUDA, {}, dt);
        EXPECT_EQ(model.params().numel(), tools::chunk_params(cfg, {0, 1, 2}, true, true));
        testing::Batch batch = testing::fixed_batch(cfg.model.seq_length, 3, cfg.model.vocab_size);
        tensor_parallel::RngTracker rng(77, 0, 0);
        GPTModelCtx ctx;
        model.forward_loss(ctx, batch.tokens, batch.labels, batch.loss_mask, {.training = true, .rng = &rng});
        EXPECT_EQ(static_cast<int64_t>(pipeline_parallel::context_bytes(ctx)),
                  tools::chunk_context_bytes(cfg, {0, 1, 2}, true, true));
        model.backward(ctx, 1.0f);
      }
}

// FP8 with per-tensor scaling on the GPU: each linear keeps q(x)^T and q(w)^T as fp8 bytes with their scale_inv slots
// (ops.h Fp8Saved) instead of its input, the GELU models' activation never written (ops.h Fp8Act) — the plan's
// fp8_saved_bytes in the CUDA format. bf16 only (FP8 on the GPU needs it).
TEST(CudaMemoryPlan, Fp8ContextBytesEqualThePlan) {
  MCPP_REQUIRE_CUDA();
  for (const std::string style : {"gpt2", "llama"})
    for (const std::string recipe : {"delayed", "tensorwise"}) {
      SCOPED_TRACE(style + " fp8 " + recipe);
      Config cfg;
      cfg.model = testing::tiny_gpu_config(style);
      cfg.model.num_layers = 2;
      cfg.model.fp8_format = "hybrid";
      cfg.model.fp8_recipe = recipe;
      cfg.training.micro_batch_size = 3;
      cfg.training.bf16 = true;
      cfg.training.device = "cuda";
      cfg.finalize();
      ModelChunk model(cfg.model, 1234, testing::single_tp(), Device::CUDA, {}, DType::BF16);
      testing::Batch batch = testing::fixed_batch(cfg.model.seq_length, 3, cfg.model.vocab_size);
      tensor_parallel::RngTracker rng(77, 0, 0);
      GPTModelCtx ctx;
      model.forward_loss(ctx, batch.tokens, batch.labels, batch.loss_mask, {.training = true, .rng = &rng});
      EXPECT_EQ(static_cast<int64_t>(pipeline_parallel::context_bytes(ctx)),
                tools::chunk_context_bytes(cfg, {0, 1}, true, true));
      model.backward(ctx, 1.0f);
    }
}

// --moe-grouped-gemm on the GPU: GroupedMLP's context (fc1's output and the activation over every row, the router's
// device counts when dropless) is the plan's, GELU and SwiGLU experts, with and without moe_act recompute.
TEST(CudaMemoryPlan, GroupedGemmMoeContextBytesEqualThePlan) {
  MCPP_REQUIRE_CUDA();
  for (const std::string style : {"gpt2", "llama"})
    for (const DType dt : float_dtypes())
      for (const double capacity : {0.0, 1.5})
        for (const bool moe_act : {false, true}) {
          SCOPED_TRACE(style + " " + std::string(dtype_name(dt)) + " capacity " + std::to_string(capacity) +
                       (moe_act ? " recompute moe_act" : ""));
          Config cfg;
          cfg.model = testing::tiny_gpu_config(style);
          cfg.model.num_layers = 2;
          cfg.model.num_moe_experts = 4;
          cfg.model.moe_grouped_gemm = true;
          cfg.model.moe_expert_capacity_factor = capacity;
          cfg.model.moe_pad_expert_input_to_capacity = capacity > 0;
          if (moe_act) cfg.model.recompute_granularity = "selective", cfg.model.recompute_modules = {"moe_act"};
          cfg.training.micro_batch_size = 3;
          cfg.training.bf16 = dt == DType::BF16;
          cfg.finalize();
          ModelChunk model(cfg.model, 1234, testing::single_tp(), Device::CUDA, {}, dt);
          testing::Batch batch = testing::fixed_batch(cfg.model.seq_length, 3, cfg.model.vocab_size);
          tensor_parallel::RngTracker rng(77, 0, 0);
          GPTModelCtx ctx;
          moe::LossTracker moe_losses(cfg.model.num_layers);  // as the trainer passes it
          model.forward_loss(ctx, batch.tokens, batch.labels, batch.loss_mask,
                             {.training = true, .rng = &rng, .moe_losses = &moe_losses});
          EXPECT_EQ(static_cast<int64_t>(pipeline_parallel::context_bytes(ctx)),
                    tools::chunk_context_bytes(cfg, {0, 1}, true, true));
          model.backward(ctx, 1.0f);
        }
}

// A run whose plan exceeds the GPU stops in the Trainer's constructor, before the model is built, with the
// planner's error (GPT-2 124M shapes at micro-batch 512: ~190 GiB of activations).
TEST(CudaMemoryPlan, TrainerRefusesARunLargerThanTheGpu) {
  MCPP_REQUIRE_CUDA();
  Config c = training_test::tiny_train_config("unused");
  c.model.num_layers = 12;
  c.model.hidden_size = 768;
  c.model.num_attention_heads = c.model.num_query_groups = 12;
  c.model.kv_channels = 64;
  c.model.ffn_hidden_size = 3072;
  c.model.seq_length = c.model.max_position_embeddings = 1024;
  c.model.attention_impl = "flash";
  c.training.device = "cuda";
  c.training.bf16 = true;
  c.training.micro_batch_size = 512;
  c.training.global_batch_size = 512;
  c.finalize();
  c.apply_world_size(1);
  c.model.set_vocab_size(50257, 1);
  c.validate();
  try {
    Trainer trainer(c, 50256, training_test::single());
    ADD_FAILURE() << "a ~200 GiB plan was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("memory plan: pipeline rank 0 needs"), std::string::npos) << msg;
    EXPECT_NE(msg.find("but the GPU has"), std::string::npos) << msg;
    EXPECT_NE(msg.find("would fit (now 512)"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace mcpp::cuda_test
