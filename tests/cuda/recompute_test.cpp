// Activation recompute on the GPU (Megatron's --recompute-granularity full uniform / block and selective)
// vs no recompute: a bf16 GPT (packed qkv, cuBLASLt GEMMs) with hidden dropout and without / with attention
// dropout (cuDNN's fused attention / the mcpp kernels' in-tile mask; Philox masks replayed from the saved
// keys), two microbatches forward, forward, backward, backward (a
// recompute runs after the other microbatch's draws advanced the live streams). Under the deterministic
// kernels (cuDNN's deterministic attention backward, GEMM autotuning off, ordered embedding backward) the
// losses, every main grad and the RNG streams after the step are bitwise identical; recompute holds fewer
// activation bytes and its recomputed layers keep nothing between forward and backward. The CPU version is
// tests/transformer/recompute_test.cpp.
#include <cstring>
#include <tuple>

#include "cuda/cuda_test_util.h"
#include "mcpp/kernels/gemm_autotune.h"
#include "mcpp/distributed/model_chunk.h"
#include "mcpp/models/gpt/gpt_model.h"
#include "mcpp/pipeline_parallel/activation_memory.h"
#include "models/gpt_test_util.h"

namespace mcpp::cuda_test {
namespace {

struct RecomputeRun {
  std::vector<double> losses;
  std::vector<Tensor> grads;  // host fp32, registration order
  nlohmann::json rng_state;
  size_t context_bytes = 0;
  std::vector<bool> layer_ctx_empty;
};

TransformerConfig recompute_gpu_config(const std::string& style, float attention_dropout,
                                       const std::string& granularity, const std::string& method, int64_t n) {
  TransformerConfig c = testing::tiny_gpu_config(style);
  c.num_layers = 3;
  c.hidden_dropout = 0.1f;
  c.attention_dropout = attention_dropout;
  c.recompute_granularity = granularity;
  c.recompute_method = method;
  c.recompute_num_layers = n;
  c.validate();
  return c;
}

RecomputeRun run_gpu(const TransformerConfig& c, bool training = true) {
  ModelChunk model(c, 7, testing::single_tp(), Device::CUDA, {}, DType::BF16);
  tensor_parallel::RngTracker rng(1234, 0, 0);
  const ForwardOptions opt{.training = training, .rng = &rng};
  RecomputeRun r;
  std::vector<GPTModelCtx> ctx(2);
  for (uint64_t m = 0; m < 2; ++m) {
    const testing::Batch b = testing::fixed_batch(c.seq_length, 2, c.vocab_size, m);
    r.losses.push_back(model.forward_loss(ctx[m], b.tokens, b.labels, b.loss_mask, opt).loss);
    if (m == 0) {
      r.context_bytes = pipeline_parallel::context_bytes(ctx[0]);
      for (const auto& l : ctx[0].decoder.layers) r.layer_ctx_empty.push_back(!l.input_layernorm.x.defined());
    }
  }
  for (size_t m = 0; m < 2; ++m) model.backward(ctx[m], 0.5f);
  for (ParamAndGradBuffer* buf : model.buffers())  // the MoE experts' buffer too
    for (const auto& p : buf->params()) r.grads.push_back(host(p->main_grad).clone());
  r.rng_state = rng.state();
  return r;
}

// The deterministic kernels and GEMM autotuning off for a test's scope; restores both switches.
struct DeterministicScope {
  bool kernels = ops::cuda::deterministic_kernels(), tune = ops::cuda::gemm_autotune();
  DeterministicScope() {
    ops::cuda::set_deterministic_kernels(true);
    ops::cuda::set_gemm_autotune(false);
  }
  ~DeterministicScope() {
    ops::cuda::set_deterministic_kernels(kernels);
    ops::cuda::set_gemm_autotune(tune);
  }
};

TEST(CudaRecompute, FullAndSelectiveEqualNoRecomputeBitwiseBf16) {
  MCPP_REQUIRE_CUDA();
  const DeterministicScope det;
  for (const std::string style : {"gpt2", "llama"})
    for (float attn_p : {0.0f, 0.1f}) {
      const std::string run = style + " attention_dropout=" + std::to_string(attn_p);
      const RecomputeRun off = run_gpu(recompute_gpu_config(style, attn_p, "", "", 0));
      EXPECT_EQ(off.losses, run_gpu(recompute_gpu_config(style, attn_p, "", "", 0)).losses) << run << ": repeatable";
      EXPECT_NE(off.losses[0], run_gpu(recompute_gpu_config(style, attn_p, "", "", 0), /*training=*/false).losses[0])
          << run << ": dropout is on (else a wrong replayed mask could not show)";
      struct Case {
        std::string granularity, method;
        int64_t n;
        std::vector<bool> empty;  // which layer contexts are dropped after the forward
      };
      const std::vector<Case> cases = {{"full", "uniform", 1, {true, true, true}},
                                       {"full", "uniform", 2, {true, true, true}},
                                       {"full", "block", 1, {true, false, false}},
                                       {"selective", "", 0, {false, false, false}}};
      for (const Case& k : cases) {
        const std::string what = run + " " + k.granularity + " " + k.method + " " + std::to_string(k.n);
        SCOPED_TRACE(what);
        const RecomputeRun on = run_gpu(recompute_gpu_config(style, attn_p, k.granularity, k.method, k.n));
        ASSERT_EQ(on.losses.size(), off.losses.size());
        for (size_t i = 0; i < on.losses.size(); ++i) EXPECT_EQ(on.losses[i], off.losses[i]) << "loss " << i;
        ASSERT_EQ(on.grads.size(), off.grads.size());
        for (size_t i = 0; i < on.grads.size(); ++i)
          EXPECT_EQ(0, std::memcmp(on.grads[i].raw(), off.grads[i].raw(), on.grads[i].nbytes())) << "grad " << i;
        EXPECT_EQ(on.rng_state, off.rng_state) << "RNG streams after the step";
        EXPECT_EQ(on.layer_ctx_empty, k.empty);
        EXPECT_LT(on.context_bytes, off.context_bytes) << "recompute must hold fewer activation bytes";
      }
    }
}

// Multi-latent attention on the GPU (bf16, head dim 192 on cuDNN: values padded; query compression, latent norms,
// YaRN; hidden dropout, deterministic kernels): "mla_up_proj" (the up projections' GEMMs and mla_qkv_fwd re-run
// before the core's backward), with "core_attn", and full recompute give the bits of no recompute, with fewer bytes.
TEST(CudaRecompute, MultiLatentAttentionEqualsNoRecomputeBitwiseBf16) {
  MCPP_REQUIRE_CUDA();
  const DeterministicScope det;
  auto config = [](const std::string& granularity, const std::string& method, int64_t n,
                   const std::vector<std::string>& modules) {
    TransformerConfig c = recompute_gpu_config("llama", 0.0f, "", "", 0);
    testing::enable_mla(c, testing::mla_gpu_dims());
    c.recompute_granularity = granularity, c.recompute_method = method, c.recompute_num_layers = n;
    c.recompute_modules = modules;
    c.validate();
    return c;
  };
  const RecomputeRun off = run_gpu(config("", "", 0, {"core_attn"}));
  for (const auto& [granularity, method, n, modules] :
       std::vector<std::tuple<std::string, std::string, int64_t, std::vector<std::string>>>{
           {"selective", "", 0, {"mla_up_proj"}},
           {"selective", "", 0, {"mla_up_proj", "core_attn", "layernorm"}},
           {"full", "uniform", 1, {"core_attn"}}}) {
    SCOPED_TRACE(granularity + " " + modules[0]);
    const RecomputeRun on = run_gpu(config(granularity, method, n, modules));
    EXPECT_EQ(on.losses, off.losses);
    ASSERT_EQ(on.grads.size(), off.grads.size());
    for (size_t i = 0; i < on.grads.size(); ++i)
      EXPECT_EQ(0, std::memcmp(on.grads[i].raw(), off.grads[i].raw(), on.grads[i].nbytes())) << "grad " << i;
    EXPECT_EQ(on.rng_state, off.rng_state);
    EXPECT_LT(on.context_bytes, off.context_bytes);
  }
}

// --recompute-modules moe_act on the GPU (MoE in every layer, 4 experts top-2, bf16, deterministic kernels): the
// forward is unchanged (the same losses); SwiGLU experts re-run swiglu_fwd on the kept fc1 output — the same bits;
// GELU experts re-run gelu_fwd on the stored bf16 pre-activation where the forward's activation came from fc1's GEMM
// epilogue (fp32 accumulator), so their grads agree to bf16 rounding. Fewer activation bytes either way.
TEST(CudaRecompute, MoeActEqualsNoRecomputeBf16) {
  MCPP_REQUIRE_CUDA();
  const DeterministicScope det;
  for (const std::string style : {"gpt2", "llama"}) {
    SCOPED_TRACE(style);
    auto config = [&](bool moe_act) {
      TransformerConfig c = recompute_gpu_config(style, 0.0f, moe_act ? "selective" : "", "", 0);
      c.num_moe_experts = 4;
      c.moe_router_topk = 2;
      c.moe_ffn_hidden_size = 64;
      c.moe_aux_loss_coeff = 0.01f;
      if (moe_act) c.recompute_modules = {"core_attn", "moe_act"};
      c.finalize();
      c.validate();
      return c;
    };
    const RecomputeRun off = run_gpu(config(false)), on = run_gpu(config(true));
    EXPECT_EQ(on.losses, off.losses);
    ASSERT_EQ(on.grads.size(), off.grads.size());
    for (size_t i = 0; i < on.grads.size(); ++i) {
      if (style == "llama")
        EXPECT_EQ(0, std::memcmp(on.grads[i].raw(), off.grads[i].raw(), on.grads[i].nbytes())) << "grad " << i;
      else
        EXPECT_REL(on.grads[i], off.grads[i], 2e-2);
    }
    EXPECT_LT(on.context_bytes, off.context_bytes);
  }
}

// --recompute-modules layernorm on the GPU (bf16, deterministic kernels, hidden and attention dropout): the norms'
// outputs re-run in backward by the plain norm kernel from the fused add + dropout + norm's kept sum (one reduction
// layout for both: the same bits), alone, with core_attn + mlp, and on a MoE model (every layer, a gated shared
// expert) with moe: the losses, every main grad and the RNG streams bitwise those of the plain run; fewer bytes held.
TEST(CudaRecompute, LayernormEqualsNoRecomputeBitwiseBf16) {
  MCPP_REQUIRE_CUDA();
  const DeterministicScope det;
  for (const std::string style : {"gpt2", "llama"})
    for (const bool moe : {false, true}) {
      auto config = [&](const std::vector<std::string>& modules) {
        TransformerConfig c = recompute_gpu_config(style, 0.1f, modules.empty() ? "" : "selective", "", 0);
        if (!modules.empty()) c.recompute_modules = modules;
        if (moe) {
          c.num_moe_experts = 4;
          c.moe_router_topk = 2;
          c.moe_ffn_hidden_size = 64;
          c.moe_shared_expert_intermediate_size = 64;
          c.moe_shared_expert_gate = true;
          c.moe_aux_loss_coeff = 0.01f;
        }
        c.finalize();
        c.validate();
        return c;
      };
      const RecomputeRun off = run_gpu(config({}));
      using Modules = std::vector<std::string>;
      for (const Modules& modules : {Modules{"layernorm"}, moe ? Modules{"layernorm", "moe", "shared_experts"}
                                                               : Modules{"core_attn", "layernorm", "mlp"}}) {
        std::string what = style + (moe ? " moe" : " dense");
        for (const auto& m : modules) what += " " + m;
        SCOPED_TRACE(what);
        const RecomputeRun on = run_gpu(config(modules));
        EXPECT_EQ(on.losses, off.losses);
        ASSERT_EQ(on.grads.size(), off.grads.size());
        for (size_t i = 0; i < on.grads.size(); ++i)
          EXPECT_EQ(0, std::memcmp(on.grads[i].raw(), off.grads[i].raw(), on.grads[i].nbytes())) << "grad " << i;
        EXPECT_EQ(on.rng_state, off.rng_state) << "RNG streams after the step";
        EXPECT_LT(on.context_bytes, off.context_bytes);
      }
    }
}

}  // namespace
}  // namespace mcpp::cuda_test
