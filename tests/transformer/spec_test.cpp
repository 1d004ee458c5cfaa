// ModuleSpec: the two registered core-attention implementations give equal outputs and gradients
// inside the same model, and unknown implementations are refused with the registered names.
#include "mcpp/transformer/spec.h"

#include "mcpp/models/gpt/gpt_layer_specs.h"

#include <gtest/gtest.h>

#include <cmath>

#include "mcpp/core/error.h"
#include "mcpp/distributed/param_and_grad_buffer.h"
#include "mcpp/distributed/model_chunk.h"
#include "mcpp/models/gpt/gpt_model.h"
#include "mcpp/tensor_parallel/random.h"
#include "mcpp/transformer/attention.h"
#include "models/gpt_test_util.h"

namespace mcpp {
namespace {

// max |a - b| / max |b| over two fp32 tensors of one size.
double rel_diff(const Tensor& a, const Tensor& b) {
  double max_diff = 0, max_abs = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    max_diff = std::max(max_diff, double(std::abs(a.data<float>()[i] - b.data<float>()[i])));
    max_abs = std::max(max_abs, double(std::abs(b.data<float>()[i])));
  }
  return max_diff / max_abs;
}

// One GPT with the flash core against the same GPT with the unfused core: logits, loss, every grad and
// (training) the RNG streams after the forward. training: hidden dropout 0.1 and attention_dropout on.
void expect_flash_equals_unfused(const std::string& style, bool training, float attention_dropout) {
  const std::string what = style + (training ? " training, attention dropout " + std::to_string(attention_dropout)
                                             : " eval");
  TransformerConfig a = testing::tiny_config(style), b = a;
  a.attention_dropout = b.attention_dropout = attention_dropout;
  a.hidden_dropout = b.hidden_dropout = training ? 0.1f : 0.0f;
  a.attention_impl = "flash";
  b.attention_impl = "unfused";
  ModelChunk ma(a, 3, testing::single_tp()), mb(b, 3, testing::single_tp());
  testing::Batch batch = testing::fixed_batch(12, 2, a.vocab_size);
  tensor_parallel::RngTracker rng_a(1234, 0, 0), rng_b(1234, 0, 0);
  const ForwardOptions opt_a{.training = training, .rng = &rng_a}, opt_b{.training = training, .rng = &rng_b};
  GPTModelCtx ca, cb;
  LossResult ra = ma.forward_loss(ca, batch.tokens, batch.labels, batch.loss_mask, opt_a);
  LossResult rb = mb.forward_loss(cb, batch.tokens, batch.labels, batch.loss_mask, opt_b);
  for (int64_t i = 0; i < ca.logits.numel(); ++i)
    ASSERT_NEAR(ca.logits.data<float>()[i], cb.logits.data<float>()[i], 1e-5) << what << " logit " << i;
  EXPECT_NEAR(ra.loss, rb.loss, 1e-6) << what;
  EXPECT_EQ(rng_a.state(), rng_b.state()) << what << ": the RNG streams after the forward";
  ma.backward(ca, 1.0f);
  mb.backward(cb, 1.0f);
  // fp32, different summation orders (blockwise online softmax vs full softmax): ~1e-6 relative.
  EXPECT_LT(rel_diff(ma.params().grad_buffer(), mb.params().grad_buffer()), 1e-5) << what;
}

TEST(ModuleSpec, FlashAndUnfusedAttentionAgree) {
  for (const std::string style : {"gpt2", "llama"}) expect_flash_equals_unfused(style, false, 0.0f);
}

// Training with hidden and attention dropout (Megatron's defaults, 0.1; and 0.3): the flash core draws its
// mask in-tile from the key the unfused core uses for ops::dropout_fwd over its materialized [b*np, s, s]
// probabilities — the same mask, so the same loss, logits and gradients up to summation order, and the
// RNG streams end at the same offsets. Without the in-tile mask (or at other indices) they differ at O(p).
// GPT-2 style runs the packed-qkv flash path, Llama style (RoPE) the split one.
TEST(ModuleSpec, FlashAndUnfusedAttentionAgreeWithAttentionDropout) {
  for (const std::string style : {"gpt2", "llama"})
    for (float p : {0.1f, 0.3f}) expect_flash_equals_unfused(style, true, p);
  // Dropout is on in this comparison: the eval forward (no dropout) differs from the training one.
  TransformerConfig c = testing::tiny_config("gpt2");
  c.attention_dropout = 0.3f;
  ModelChunk m(c, 3, testing::single_tp());
  testing::Batch batch = testing::fixed_batch(12, 2, c.vocab_size);
  tensor_parallel::RngTracker rng(1234, 0, 0);
  GPTModelCtx train_ctx, eval_ctx;
  m.forward_loss(train_ctx, batch.tokens, batch.labels, batch.loss_mask, {.training = true, .rng = &rng});
  m.forward_loss(eval_ctx, batch.tokens, batch.labels, batch.loss_mask, {.training = false});
  EXPECT_GT(rel_diff(train_ctx.logits, eval_ctx.logits), 1e-3) << "attention dropout changed nothing";
}

// --deterministic-mode reaches the core attention's options (CUDA: the mcpp kernels instead of cuDNN's
// fused attention), along with the scale and causality SelfAttention sets.
TEST(ModuleSpec, DeterministicModeReachesTheCoreAttention) {
  for (bool deterministic : {false, true}) {
    TransformerConfig c = testing::tiny_config("gpt2");
    c.deterministic_mode = deterministic;
    CoreAttentionOptions seen;
    TransformerLayerSpec spec;
    spec.core_attention = "flash (recording)";
    spec.make_core_attention = [&seen](const CoreAttentionOptions& o, const tensor_parallel::TPContext&) {
      seen = o;
      return make_flash_attention(o);
    };
    ParamAndGradBuffer params;
    SelfAttention attn(params, "decoder.layers.0.self_attention", c, spec, testing::single_tp());
    EXPECT_EQ(seen.deterministic, deterministic);
    EXPECT_TRUE(seen.causal);
    EXPECT_FLOAT_EQ(seen.softmax_scale, 1.0f / std::sqrt(static_cast<float>(c.kv_channels)));
  }
}

TEST(ModuleSpec, UnknownImplementationNamesRegistered) {
  TransformerConfig c = testing::tiny_config("gpt2");
  c.attention_impl = "cudnn_magic";
  try {
    get_gpt_layer_local_spec(c, LayerMlp::Dense, "local");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("flash"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("unfused"), std::string::npos);
  }
}

}  // namespace
}  // namespace mcpp
