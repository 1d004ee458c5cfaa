// KV-cache generation on the CPU (models/gpt/text_generation.h, transformer/inference_context.h): the cached path's
// next-token logits equal the full forward's last row after the prefill and after every decode step (ragged batches:
// each sequence at its own position), and greedy decoding gives exactly the no-cache path's tokens — single prompts,
// ragged batches (each as generated alone), across the window (the cache hands over to the full forward), with a
// stop token. Models: GPT-2 style (learned absolute positions; the full forward reads the packed qkv), Llama style
// (RoPE at the step's positions, GQA, RMSNorm, SwiGLU), qk layernorm, unfused core attention, multi-latent attention
// (both tiny MLA shapes: values narrower and wider than the keys), dropless MoE. Tolerance 1e-5 relative: float32,
// the same math in other summation orders (one-row GEMMs, the decode attention's key loop vs the flash tiles).
#include <gtest/gtest.h>

#include <cstdio>

#include "mcpp/core/error.h"
#include "mcpp/distributed/model_chunk.h"
#include "mcpp/models/gpt/text_generation.h"
#include "models/generation_test_util.h"
#include "models/gpt_test_util.h"

namespace mcpp {
namespace {
using testing::cached_vs_full_logits;

TransformerConfig variant(const std::string& name) {
  TransformerConfig c = testing::tiny_config(name == "gpt2" || name == "unfused" ? "gpt2" : "llama");
  if (name == "qk_layernorm") c.qk_layernorm = true;
  if (name == "unfused") c.attention_impl = "unfused";
  if (name == "mla_llama") c = testing::mla_tiny_config("llama");
  if (name == "mla_gpt2") c = testing::mla_tiny_config("gpt2");
  if (name == "moe") {
    c.num_moe_experts = 4;
    c.moe_router_topk = 2;
    c.finalize();
  }
  c.validate();
  return c;
}

const std::vector<std::vector<int32_t>> kPrompts = {{5, 16, 41, 7}, {3}, {88, 2, 9, 60, 11, 30}};

TEST(KvCacheGeneration, CachedLogitsEqualTheFullForwardEveryStep) {
  for (const std::string name : {"gpt2", "llama", "qk_layernorm", "unfused", "mla_llama", "mla_gpt2", "moe"}) {
    SCOPED_TRACE(name);
    ModelChunk model(variant(name), 1234, testing::single_tp());
    const double one = cached_vs_full_logits(model, {kPrompts[0]}, 6);
    const double ragged = cached_vs_full_logits(model, kPrompts, 5);  // right padding, per-sequence positions
    std::printf("[ measured ] %s: cached vs full logits %.3g (one prompt), %.3g (ragged batch)\n", name.c_str(), one,
                ragged);
    EXPECT_LT(one, 1e-5);
    EXPECT_LT(ragged, 1e-5);
  }
}

TEST(KvCacheGeneration, GreedyTokensEqualTheNoCachePath) {
  for (const std::string name : {"gpt2", "llama", "mla_llama", "moe"}) {
    SCOPED_TRACE(name);
    ModelChunk model(variant(name), 1234, testing::single_tp());
    const GenerationOptions cached{.max_new_tokens = 7}, plain{.max_new_tokens = 7, .kv_cache = false};
    for (const auto& p : kPrompts) EXPECT_EQ(generate(model, p, cached), generate(model, p, plain));
    const auto batch = generate_batch(model, kPrompts, cached);
    ASSERT_EQ(batch.size(), kPrompts.size());
    for (size_t i = 0; i < kPrompts.size(); ++i) EXPECT_EQ(batch[i], generate(model, kPrompts[i], plain)) << i;
    EXPECT_EQ(generate_batch(model, kPrompts, plain), batch);
  }
}

// Past the window (seq_length 12) the no-cache path slides; the cached one hands the unfinished sequences over to it:
// the same tokens. Sampling (temperature, top-k) draws the same (seed, step) numbers either way.
TEST(KvCacheGeneration, AcrossTheWindowAndWhenSampling) {
  ModelChunk model(variant("llama"), 1234, testing::single_tp());
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5, 6, 7, 8}, {9, 10}};
  const GenerationOptions cached{.max_new_tokens = 10}, plain{.max_new_tokens = 10, .kv_cache = false};
  const auto got = generate_batch(model, prompts, cached);
  EXPECT_EQ(got, generate_batch(model, prompts, plain));
  EXPECT_EQ(got[0].size(), 18u);
  const GenerationOptions sample{.max_new_tokens = 8, .temperature = 0.8f, .top_k = 20, .seed = 5};
  GenerationOptions sample_plain = sample;
  sample_plain.kv_cache = false;
  EXPECT_EQ(generate_batch(model, kPrompts, sample), generate_batch(model, kPrompts, sample_plain));
}

// A sequence that emits the stop token ends there; the others go on (the stopped one rides along in the batch).
TEST(KvCacheGeneration, StopTokenEndsOneSequenceOfTheBatch) {
  ModelChunk model(variant("gpt2"), 1234, testing::single_tp());
  const auto free_run = generate(model, kPrompts[0], {.max_new_tokens = 6, .kv_cache = false});
  const int32_t stop = free_run[kPrompts[0].size() + 1];  // its second generated token
  const GenerationOptions cached{.max_new_tokens = 6, .stop_token = stop},
      plain{.max_new_tokens = 6, .stop_token = stop, .kv_cache = false};
  const auto got = generate_batch(model, kPrompts, cached);
  for (size_t i = 0; i < kPrompts.size(); ++i) EXPECT_EQ(got[i], generate(model, kPrompts[i], plain)) << i;
  EXPECT_LE(got[0].size(), kPrompts[0].size() + 2);
  EXPECT_EQ(got[0].back(), stop);
}

TEST(KvCacheGeneration, BadInputsAreNamedErrors) {
  ModelChunk model(variant("gpt2"), 1234, testing::single_tp());
  EXPECT_THROW(generate_batch(model, {}, {}), Error);
  EXPECT_THROW(generate_batch(model, {{1, 2}, {}}, {}), Error);
  EXPECT_THROW(generate_batch(model, {{1, 100}}, {}), Error);  // vocab_size 100
  InferenceContext ic(1, 4, Device::CPU);
  Tensor five = Tensor::zeros({5, 1}, DType::I32);
  GPTModelCtx ctx;
  try {
    model.forward_logits(ctx, five, {.training = false, .inference = &ic});
    ADD_FAILURE() << "a prompt longer than the cache should be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the cache"), std::string::npos) << e.what();
  }
  Tensor two = Tensor::zeros({2, 2}, DType::I32);
  EXPECT_THROW(model.forward_logits(ctx, two, {.training = false, .inference = &ic}), Error);  // 2 sequences, not 1
}

}  // namespace
}  // namespace mcpp
