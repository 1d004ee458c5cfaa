// The whole GPT on CUDA against the same model on the CPU backend (the reference, itself checked
// against float64 PyTorch in tests/models): same seed -> same initial weights; loss, logits and every
// parameter's main grad after one forward + backward, GPT-2 style (LayerNorm, GELU, learned positions,
// tied embeddings) and Llama style (RMSNorm, SwiGLU, RoPE, GQA, untied), head dim 64 (the CUDA flash
// attention's). fp32: the CUDA model computes in fp32 (cuBLASLt without TF32) -> close to rounding.
// bf16 (mixed precision): bf16 params and activations, fp32 main grads; compared with the CPU model run
// from the bf16-rounded weights, so the error is the bf16 activations' only.
// With dropout (training, hidden 0.1 + attention 0.1, Megatron's defaults): the CUDA kernels draw the CPU's
// Philox masks (the attention's in-tile on the mcpp kernels, cuDNN switched off), so the same comparison holds.
#include "cuda/cuda_test_util.h"
#include "mcpp/distributed/model_chunk.h"
#include "mcpp/models/gpt/gpt_model.h"
#include "mcpp/tensor_parallel/random.h"
#include "models/gpt_test_util.h"

namespace mcpp::cuda_test {
namespace {

struct Run {
  double loss = 0;
  Tensor logits;                    // [s*b, V] fp32 host
  std::vector<Tensor> grads;        // fp32 host, registration order
  std::vector<std::string> keys;
  std::vector<double> mtp_losses;   // per MTP depth
};

Run run_model(const TransformerConfig& c, Device dev, DType param_dtype, bool round_weights_to_bf16,
              bool training) {
  ModelChunk model(c, 1234, testing::single_tp(), dev, {}, param_dtype);
  if (round_weights_to_bf16)  // the CPU reference of the bf16 run starts from the bf16-rounded weights
    for (const auto& p : model.params().params()) p->data.copy_from(p->data.to(DType::BF16).to(DType::F32));
  testing::Batch batch = testing::fixed_batch(48, 3, c.vocab_size);
  GPTModelCtx ctx;
  Run r;
  tensor_parallel::RngTracker rng(77, 0, 0);
  MtpLossTracker mtp(c.mtp_num_layers);
  // With MTP the loss forward also writes the logits' gradient (the trainer's fused cross entropy at tp 1), for the
  // main head and every depth: the logits are read before it (forward_logits, no labels), then the loss.
  if (c.mtp_num_layers > 0) {
    GPTModelCtx lctx;
    r.logits = host(model.forward_logits(lctx, batch.tokens, {.training = false})).clone();
  }
  r.loss = model.forward_loss(ctx, batch.tokens, batch.labels, batch.loss_mask,
                              {.training = training, .rng = &rng,
                               .loss_grad_scale = c.mtp_num_layers > 0 ? 1.0f : 0.0f, .mtp_losses = &mtp})
               .loss;
  if (c.mtp_num_layers == 0)
    r.logits = host(ctx.logits).clone();  // backward overwrites the logits in place (dlogits); on the CPU
                                          // host() is the same storage
  for (const auto& [sum, count] : mtp.take()) r.mtp_losses.push_back(sum / count);
  model.backward(ctx, 1.0f);
  for (ParamAndGradBuffer* buf : model.buffers())  // the MoE experts' buffer too
    for (const auto& p : buf->params()) {
      r.grads.push_back(host(p->main_grad));
      r.keys.push_back(p->spec.key);
    }
  return r;
}

// capacity (MoE): the experts capped (drop policy "position": the same drops on both backends whatever the
// probabilities' last bits), padded to capacity, with a gated shared expert, in the second layer only.
// deepseek (MoE): DeepSeek-V3's router — sigmoid scores, 4 experts in 2 groups (each token's from its best group),
// routed scaling 2.5, no z-loss.
// noise (MoE): the router's input jitter and random logits (training forwards; the CUDA kernels draw the CPU's
// numbers from the same keys).
// qk_layernorm: --qk-layernorm (the model's norm on each head's q and k before RoPE).
// mtp: 2 multi-token prediction depths (loss scaling 0.3, per-token loss), the losses' forward fused with the
// logits' gradient.
// mla: multi-latent attention at head dim 64 (llama: query compression, YaRN, values padded 32 -> 64; gpt2: RoPE,
// no query compression, queries / keys padded 48 -> 64), latent norms (qk_layernorm).
struct Variant {
  bool dropout = false, moe = false, capacity = false, deepseek = false, noise = false, qk_layernorm = false;
  bool mtp = false, mla = false;
};

void compare(const std::string& style, DType dt, const Variant& v = {}) {
  const auto [dropout, moe, capacity, deepseek, noise, qk_layernorm, mtp, mla] = v;
  // cuDNN's attention dropout draws its own mask: the comparison with the CPU's runs the mcpp kernels
  const CudnnAttentionScope attention(!dropout && ops::cuda::cudnn_attention());
  TransformerConfig c = testing::tiny_gpu_config(style == "gpt2_rope" ? "gpt2" : style);
  if (style == "gpt2_rope") c.position_embedding_type = PositionEmbedding::Rope;
  if (dropout) c.hidden_dropout = c.attention_dropout = 0.1f;
  c.qk_layernorm = qk_layernorm;
  if (mla) {  // head dim 64 (the mcpp kernels' too): llama values padded 32 -> 64, gpt2 queries / keys 48 -> 64
    testing::enable_mla(c,
                        style == "llama"
                            ? testing::MlaDims{.q_lora_rank = 48, .kv_lora_rank = 32, .qk_head_dim = 48,
                                               .qk_pos_emb_head_dim = 16, .v_head_dim = 32, .rope_type = "yarn",
                                               .rotary_scaling_factor = 4.0f, .mscale = 0.9f, .mscale_all_dim = 0.7f,
                                               .original_max_position_embeddings = 16}
                            : testing::MlaDims{.q_lora_rank = 0, .kv_lora_rank = 32, .qk_head_dim = 32,
                                               .qk_pos_emb_head_dim = 16, .v_head_dim = 64, .rope_type = "rope"},
                        qk_layernorm);
    c.finalize();
    c.validate();
  }
  if (mtp) {
    c.mtp_num_layers = 2;
    c.mtp_loss_scaling_factor = 0.3f;
    c.calculate_per_token_loss = true;
  }
  if (moe) {  // MoE layers: fp32 only (bf16 logits may route a near-tie token to another expert than the CPU's)
    c.num_moe_experts = 4;
    c.moe_router_topk = 2;
    c.moe_aux_loss_coeff = 0.01f;
    c.moe_z_loss_coeff = 0.001f;
    if (capacity) {
      c.moe_expert_capacity_factor = 0.75;
      c.moe_token_drop_policy = "position";
      c.moe_pad_expert_input_to_capacity = true;
      c.moe_shared_expert_intermediate_size = 24;
      c.moe_shared_expert_gate = true;
      c.moe_layer_freq = "[0]*" + std::to_string(c.num_layers - 1) + "+[1]";
    }
    if (deepseek) {
      c.moe_z_loss_coeff = 0.0f;
      c.moe_router_score_function = "sigmoid";
      c.moe_router_num_groups = 2;
      c.moe_router_group_topk = 1;
      c.moe_router_topk_scaling_factor = 2.5f;
    }
    if (noise) {
      c.moe_input_jitter_eps = 0.1f;
      c.moe_router_force_load_balancing = true;
    }
    c.finalize();
    c.validate();
  }
  const Run want = run_model(c, Device::CPU, DType::F32, dt != DType::F32, dropout || noise || mtp);
  const Run got = run_model(c, Device::CUDA, dt, false, dropout || noise || mtp);
  ASSERT_EQ(got.mtp_losses.size(), want.mtp_losses.size());
  for (size_t k = 0; k < got.mtp_losses.size(); ++k)
    EXPECT_NEAR(got.mtp_losses[k], want.mtp_losses[k], (dt == DType::F32 ? 1e-5 : 1e-2) * want.mtp_losses[k]) << k;
  if (dropout) {  // the masks are on: the eval forward differs
    const Run eval = run_model(c, Device::CPU, DType::F32, dt != DType::F32, false);
    EXPECT_GT(std::abs(eval.loss - want.loss), 1e-4) << "dropout changed nothing";
  }
  // fp32: float rounding and summation order through 2 layers (observed ~1e-6); bf16: every activation
  // rounded to bf16 (2^-9 relative) through 2 layers, the loss is a mean over 144 tokens.
  const double loss_tol = dt == DType::F32 ? 1e-5 : 1e-2;
  std::printf("[ measured ] %s %s%s loss: cuda %.7f cpu %.7f\n", style.c_str(), std::string(dtype_name(dt)).c_str(),
              dropout ? " dropout" : "", got.loss, want.loss);
  EXPECT_NEAR(got.loss, want.loss, loss_tol * std::abs(want.loss));
  EXPECT_REL(got.logits, want.logits, tol(dt, 1e-5, 3e-2));
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t i = 0; i < got.grads.size(); ++i) {
    SCOPED_TRACE(got.keys[i]);
    if (got.keys[i].ends_with("k_layernorm.bias")) {  // zero in exact arithmetic (softmax ignores a shift of
      const float* g = got.grads[i].data<float>();   // every key by one vector): rounding on both sides
      for (int64_t j = 0; j < got.grads[i].numel(); ++j) EXPECT_LT(std::abs(g[j]), 1e-5f) << j;
      continue;
    }
    // grads of bf16 activations: the backward multiplies several rounded factors (~1e-2 relative norm)
    EXPECT_REL(got.grads[i], want.grads[i], tol(dt, 2e-4, 8e-2));
  }
}

TEST(CudaGPTModel, Gpt2StyleFp32MatchesCpu) { MCPP_REQUIRE_CUDA(); compare("gpt2", DType::F32); }
TEST(CudaGPTModel, Gpt2StyleMoeFp32MatchesCpu) { MCPP_REQUIRE_CUDA(); compare("gpt2", DType::F32, {.moe = true}); }
TEST(CudaGPTModel, LlamaStyleMoeFp32MatchesCpu) { MCPP_REQUIRE_CUDA(); compare("llama", DType::F32, {.moe = true}); }
TEST(CudaGPTModel, MoeCapacityPaddedSharedFp32MatchesCpu) {
  MCPP_REQUIRE_CUDA();
  compare("llama", DType::F32, {.moe = true, .capacity = true});
}
TEST(CudaGPTModel, MoeSigmoidGroupLimitedFp32MatchesCpu) {
  MCPP_REQUIRE_CUDA();
  compare("gpt2", DType::F32, {.moe = true, .deepseek = true});
}
TEST(CudaGPTModel, MoeJitterRandomLogitsFp32MatchesCpu) {
  MCPP_REQUIRE_CUDA();
  compare("llama", DType::F32, {.moe = true, .noise = true});
}
TEST(CudaGPTModel, LlamaStyleFp32MatchesCpu) { MCPP_REQUIRE_CUDA(); compare("llama", DType::F32); }
TEST(CudaGPTModel, Gpt2StyleBf16MatchesCpu) { MCPP_REQUIRE_CUDA(); compare("gpt2", DType::BF16); }
TEST(CudaGPTModel, LlamaStyleBf16MatchesCpu) { MCPP_REQUIRE_CUDA(); compare("llama", DType::BF16); }
TEST(CudaGPTModel, Gpt2StyleFp32WithDropoutMatchesCpu) {
  MCPP_REQUIRE_CUDA();
  compare("gpt2", DType::F32, {.dropout = true});
}
TEST(CudaGPTModel, LlamaStyleFp32WithDropoutMatchesCpu) {
  MCPP_REQUIRE_CUDA();
  compare("llama", DType::F32, {.dropout = true});
}
TEST(CudaGPTModel, Gpt2StyleBf16WithDropoutMatchesCpu) {
  MCPP_REQUIRE_CUDA();
  compare("gpt2", DType::BF16, {.dropout = true});
}
// --qk-layernorm: the norm kernels over rows of hn = 64 channels (RMSNorm before RoPE; LayerNorm with biases on
// the GPT-2 style, whose attention then leaves the packed path).
TEST(CudaGPTModel, LlamaStyleQkLayernormFp32MatchesCpu) {
  MCPP_REQUIRE_CUDA();
  compare("llama", DType::F32, {.qk_layernorm = true});
}
TEST(CudaGPTModel, LlamaStyleQkLayernormBf16MatchesCpu) {
  MCPP_REQUIRE_CUDA();
  compare("llama", DType::BF16, {.qk_layernorm = true});
}
TEST(CudaGPTModel, Gpt2StyleQkLayernormFp32WithDropoutMatchesCpu) {
  MCPP_REQUIRE_CUDA();
  compare("gpt2", DType::F32, {.dropout = true, .qk_layernorm = true});
}

// Multi-token prediction: the depths' embeddings, eh_proj, layers and fused losses on the GPU (Llama style: untied,
// the word embeddings' gradient from the main embedding and both depths; GPT-2 style with RoPE: tied).
TEST(CudaGPTModel, LlamaStyleMtpFp32MatchesCpu) { MCPP_REQUIRE_CUDA(); compare("llama", DType::F32, {.mtp = true}); }
TEST(CudaGPTModel, LlamaStyleMtpBf16MatchesCpu) { MCPP_REQUIRE_CUDA(); compare("llama", DType::BF16, {.mtp = true}); }
TEST(CudaGPTModel, Gpt2StyleRopeMtpBf16WithDropoutMatchesCpu) {
  MCPP_REQUIRE_CUDA();
  compare("gpt2_rope", DType::BF16, {.dropout = true, .mtp = true});
}
// Multi-latent attention (mla_qkv_fwd / bwd, copy_columns, the padded heads through cuDNN / the tensor-core kernels
// in bf16, the fp32 kernels in fp32; the latent norms).
TEST(CudaGPTModel, LlamaStyleMlaFp32MatchesCpu) {
  MCPP_REQUIRE_CUDA();
  compare("llama", DType::F32, {.qk_layernorm = true, .mla = true});
}
TEST(CudaGPTModel, LlamaStyleMlaBf16MatchesCpu) {
  MCPP_REQUIRE_CUDA();
  compare("llama", DType::BF16, {.qk_layernorm = true, .mla = true});
}
TEST(CudaGPTModel, Gpt2StyleMlaBf16WithDropoutMatchesCpu) {
  MCPP_REQUIRE_CUDA();
  compare("gpt2", DType::BF16, {.dropout = true, .qk_layernorm = true, .mla = true});
}

}  // namespace
}  // namespace mcpp::cuda_test
