// SelfAttention's packed path (no RoPE + flash core: the core attention reads linear_qkv's fused output and
// returns dqkv, no qkv_split / qkv_merge) against the split path it replaces, on the CPU backend:
//   - output, dx and every parameter's main grad BITWISE equal to the same layer whose core refuses the
//     packed form (a wrapper around the flash core), MHA and GQA, s not a multiple of the 64-row tile;
//   - the path choice: packed without RoPE (ctx.core holds qkv, no q/k/v), split with RoPE;
//   - selective recompute on the packed path keeps only the fused input between forward and backward,
//     and a GPT with it is bitwise equal to one without, holding fewer context bytes (activation_memory
//     counts the new ctx fields).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "kernels/grad_check.h"
#include "mcpp/core/error.h"
#include "mcpp/distributed/param_and_grad_buffer.h"
#include "mcpp/distributed/model_chunk.h"
#include "mcpp/models/gpt/gpt_model.h"
#include "mcpp/pipeline_parallel/activation_memory.h"
#include "mcpp/transformer/attention.h"
#include "mcpp/transformer/spec.h"
#include "models/gpt_test_util.h"

namespace mcpp {
namespace {

// The flash core with the packed form switched off: SelfAttention then takes the split path.
class SplitOnlyFlash final : public CoreAttention {
 public:
  explicit SplitOnlyFlash(const CoreAttentionOptions& opt) : inner_(make_flash_attention(opt)) {}
  Tensor forward(CoreAttentionCtx& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                 const ForwardOptions& opt) const override {
    return inner_->forward(ctx, q, k, v, opt);
  }
  CoreAttentionGrads backward(CoreAttentionCtx& ctx, const Tensor& dout) const override {
    return inner_->backward(ctx, dout);
  }

 private:
  std::unique_ptr<CoreAttention> inner_;
};

TransformerLayerSpec spec_of(bool packed) {
  TransformerLayerSpec spec;
  spec.core_attention = packed ? "flash" : "flash (split only)";
  spec.make_core_attention = [packed](const CoreAttentionOptions& o,
                                      const tensor_parallel::TPContext&) -> std::unique_ptr<CoreAttention> {
    if (packed) return make_flash_attention(o);
    return std::make_unique<SplitOnlyFlash>(o);
  };
  return spec;
}

struct LayerRun {
  Tensor y, dx;
  std::vector<Tensor> grads;
  bool core_has_qkv = false, core_has_q = false, kept_fused = false;  // the core's input: fused / split
};

LayerRun run_layer(const TransformerConfig& c, bool packed, int64_t s, int64_t b, const RopeTables* rope) {
  ParamAndGradBuffer params;
  const tensor_parallel::TPContext tp = testing::single_tp();
  SelfAttention attn(params, "decoder.layers.0.self_attention", c, spec_of(packed), tp);
  params.finalize(99);
  Tensor x = testing::random_tensor({s, b, c.hidden_size}, 5);
  Tensor dy = testing::random_tensor({s, b, c.hidden_size}, 6);
  SelfAttentionCtx ctx;
  LayerRun r;
  r.y = attn.forward(ctx, x, rope, {.training = true}).clone();
  // Selective recompute empties ctx.core after the forward and keeps its inputs in ctx instead.
  r.core_has_qkv = ctx.core.qkv.defined() || ctx.fused_qkv.defined();
  r.core_has_q = ctx.core.q.defined() || ctx.q.defined();
  r.kept_fused = ctx.fused_qkv.defined();
  r.dx = attn.backward(ctx, dy, rope).clone();
  for (const auto& p : params.params()) r.grads.push_back(p->main_grad.clone());
  return r;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

void expect_layers_equal(const LayerRun& a, const LayerRun& b, const std::string& what) {
  EXPECT_TRUE(same_bits(a.y, b.y)) << what << " output";
  EXPECT_TRUE(same_bits(a.dx, b.dx)) << what << " dx";
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) EXPECT_TRUE(same_bits(a.grads[i], b.grads[i])) << what << " grad " << i;
}

TEST(PackedQkvAttention, EqualsSplitPathBitwise) {
  for (int64_t ng : {4, 2, 1}) {  // MHA, GQA r = 2, MQA
    for (const std::string recompute : {"", "selective"}) {
      TransformerConfig c = testing::tiny_config("gpt2");
      c.num_query_groups = ng;
      c.recompute_granularity = recompute;
      const std::string what = "ng=" + std::to_string(ng) + " recompute=" + recompute;
      const LayerRun packed = run_layer(c, true, 70, 2, nullptr);
      const LayerRun split = run_layer(c, false, 70, 2, nullptr);
      EXPECT_TRUE(packed.core_has_qkv && !packed.core_has_q) << what << ": the flash core must take the packed path";
      EXPECT_TRUE(!split.core_has_qkv && split.core_has_q) << what;
      EXPECT_EQ(packed.kept_fused, recompute == "selective") << what << ": selective recompute keeps the fused input";
      expect_layers_equal(packed, split, what);
    }
  }
}

TEST(PackedQkvAttention, RopeKeepsTheSplitPath) {
  TransformerConfig c = testing::tiny_config("gpt2");
  const RopeTables rope = make_rope_tables(12, c.kv_channels, 10000.0f, Device::CPU);
  const LayerRun r = run_layer(c, true, 12, 2, &rope);
  EXPECT_TRUE(r.core_has_q && !r.core_has_qkv) << "RoPE rotates q and k: the split path must run";
}

TEST(PackedQkvAttention, UnfusedCoreRefusesThePackedForm) {
  const std::unique_ptr<CoreAttention> core = make_unfused_attention({});
  EXPECT_FALSE(core->supports_packed_qkv());
  CoreAttentionCtx ctx;
  EXPECT_THROW(core->forward_qkv(ctx, Tensor::zeros({2, 1, 24}), 1, 1, {}), Error);
}

struct ModelRun {
  double loss = 0;
  std::vector<Tensor> grads;
  size_t context_bytes = 0;
  bool kept_fused = false, core_empty = false;
};

ModelRun run_model(const std::string& recompute) {
  TransformerConfig c = testing::tiny_config("gpt2");  // flash core, learned positions: the packed path
  c.recompute_granularity = recompute;
  c.validate();
  ModelChunk model(c, 7, testing::single_tp());
  const testing::Batch batch = testing::fixed_batch(c.seq_length, 2, c.vocab_size);
  GPTModelCtx ctx;
  ModelRun r;
  r.loss = model.forward_loss(ctx, batch.tokens, batch.labels, batch.loss_mask, {.training = true}).loss;
  r.context_bytes = pipeline_parallel::context_bytes(ctx);
  const SelfAttentionCtx* attn = ctx.decoder.layers[0].self_attention.as<SelfAttentionCtx>();
  EXPECT_NE(attn, nullptr) << "layer 0's attention is a SelfAttention";
  r.kept_fused = attn && attn->fused_qkv.defined();
  r.core_empty = attn && !attn->core.out.defined();
  model.backward(ctx, 1.0f);
  for (const auto& p : model.params().params()) r.grads.push_back(p->main_grad.clone());
  return r;
}

TEST(PackedQkvAttention, SelectiveRecomputeOnThePackedPathIsExactAndSmaller) {
  const ModelRun off = run_model(""), on = run_model("selective");
  EXPECT_EQ(off.loss, on.loss);
  ASSERT_EQ(off.grads.size(), on.grads.size());
  for (size_t i = 0; i < off.grads.size(); ++i) EXPECT_TRUE(same_bits(off.grads[i], on.grads[i])) << "grad " << i;
  EXPECT_TRUE(on.kept_fused && on.core_empty) << "selective: only the fused qkv is held between forward and backward";
  EXPECT_FALSE(off.kept_fused);
  // Without recompute the core holds qkv, out and lse; with it the fused qkv alone — out's storage stays
  // reachable as linear_proj's saved input, so exactly the lse [b, np, s] float32 of each layer is freed.
  const TransformerConfig c = testing::tiny_config("gpt2");
  const size_t lse_bytes = static_cast<size_t>(2 * c.num_attention_heads * c.seq_length) * sizeof(float);
  EXPECT_EQ(off.context_bytes - on.context_bytes, lse_bytes * static_cast<size_t>(c.num_layers));
}

}  // namespace
}  // namespace mcpp
