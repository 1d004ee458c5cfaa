// The GPT layer specs (models/gpt/gpt_layer_specs.h): a model built from the config's default spec and the same
// model built from a spec assembled by hand out of the public parts are one model (same parameters in the same
// order, bitwise the same losses and gradients); swapping one part in the spec — the core attention, or a new
// attention module the model has never heard of — changes nothing else. The layers' linears ("local" | "fp8", with
// Megatron's --first-last-layers-bf16) on the CPU backend's emulated FP8: a layer in bf16 keeps no FP8 state and runs
// bitwise as without FP8.
#include "mcpp/models/gpt/gpt_layer_specs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "mcpp/core/error.h"
#include "mcpp/distributed/model_chunk.h"
#include "mcpp/pipeline_parallel/activation_memory.h"
#include "mcpp/tensor_parallel/random.h"
#include "mcpp/transformer/attention.h"
#include "models/gpt_test_util.h"

namespace mcpp {
namespace {

struct SpecRun {
  std::vector<std::string> keys;  // every parameter, in registration order
  double loss = 0;
  Tensor logits;
  std::vector<Tensor> grads;
  size_t context_bytes = 0;
};

// One training step (hidden and attention dropout on) of a model built from `spec`.
SpecRun run(const TransformerConfig& c, const GPTModelSpec& spec) {
  ModelChunk model(spec, c, 11, testing::single_tp());
  const testing::Batch batch = testing::fixed_batch(c.seq_length, 2, c.vocab_size);
  tensor_parallel::RngTracker rng(1234, 0, 0);
  GPTModelCtx ctx;
  SpecRun r;
  r.loss = model.forward_loss(ctx, batch.tokens, batch.labels, batch.loss_mask, {.training = true, .rng = &rng}).loss;
  r.logits = ctx.logits.clone();
  r.context_bytes = pipeline_parallel::context_bytes(ctx);
  model.backward(ctx, 1.0f);
  for (ParamAndGradBuffer* buf : model.buffers())
    for (const auto& p : buf->params()) {
      r.keys.push_back(p->spec.key);
      r.grads.push_back(p->main_grad.clone());
    }
  return r;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data<float>(), b.data<float>(), a.nbytes()) == 0;
}

void expect_same_run(const SpecRun& a, const SpecRun& b, const std::string& what) {
  EXPECT_EQ(a.keys, b.keys) << what;
  EXPECT_EQ(a.loss, b.loss) << what;  // bitwise: the same modules in the same order
  EXPECT_TRUE(bitwise_equal(a.logits, b.logits)) << what;
  ASSERT_EQ(a.grads.size(), b.grads.size()) << what;
  for (size_t i = 0; i < a.grads.size(); ++i) EXPECT_TRUE(bitwise_equal(a.grads[i], b.grads[i])) << what << " " << a.keys[i];
  EXPECT_EQ(a.context_bytes, b.context_bytes) << what;
}

// A dense/MoE-interleaved Llama with an MTP depth, and a DeepSeek-style MLA model.
std::vector<std::pair<std::string, TransformerConfig>> configs() {
  TransformerConfig moe = testing::tiny_config("llama");
  moe.num_layers = 3;
  moe.num_moe_experts = 4;
  moe.moe_router_topk = 2;
  moe.moe_ffn_hidden_size = 16;
  moe.moe_layer_freq = "[1,0,1]";
  moe.mtp_num_layers = 1;
  moe.hidden_dropout = 0.1f;
  moe.attention_dropout = 0.1f;
  moe.validate();
  TransformerConfig mla = testing::mla_tiny_config("llama");
  mla.hidden_dropout = 0.1f;
  mla.validate();
  return {{"llama moe [1,0,1] + mtp", moe}, {"llama mla", mla}};
}

// The spec written out part by part, as a reader would assemble it without get_gpt_model_spec; linears: one name
// per layer (none: "local" everywhere).
GPTModelSpec assembled(const TransformerConfig& c, const std::vector<bool>& moe_layers,
                       const std::vector<std::string>& linears = {}) {
  GPTModelSpec spec;
  for (size_t i = 0; i < moe_layers.size(); ++i) {
    const bool moe = moe_layers[i];
    TransformerLayerSpec l;
    if (!linears.empty()) set_layer_linear(l, linears[i], c);
    l.core_attention = "flash";
    l.make_core_attention = core_attention_factory("flash");
    l.attention = c.multi_latent_attention ? "mla" : "self_attention";
    l.make_attention = c.multi_latent_attention ? mla_factory() : self_attention_factory();
    l.mlp = moe ? "moe" : "mlp";
    l.make_mlp = moe ? moe_factory() : dense_mlp_factory();
    l.norm = "RMSNorm";
    l.make_input_layernorm = l.make_pre_mlp_layernorm = norm_factory(c);
    spec.decoder.layer_specs.push_back(l);
  }
  spec.decoder.make_final_layernorm = norm_factory(c);
  spec.mtp_layer = {.make_enorm = norm_factory(c),
                    .make_hnorm = norm_factory(c),
                    .make_final_layernorm = norm_factory(c),
                    .transformer_layer = spec.decoder.layer_specs.back()};
  return spec;
}

TEST(GPTLayerSpecs, DefaultAndAssembledSpecsBuildTheSameModel) {
  for (const auto& [what, c] : configs()) {
    const GPTModelSpec def = get_gpt_model_spec(c);
    ASSERT_EQ(def.decoder.layer_specs.size(), static_cast<size_t>(c.num_layers)) << what;
    std::vector<bool> moe_layers;
    for (const TransformerLayerSpec& l : def.decoder.layer_specs) moe_layers.push_back(l.mlp == "moe");
    if (c.num_moe_experts > 0) EXPECT_EQ(moe_layers, (std::vector<bool>{true, false, true})) << what;
    EXPECT_EQ(def.decoder.layer_specs[0].attention, c.multi_latent_attention ? "mla" : "self_attention") << what;
    expect_same_run(run(c, def), run(c, assembled(c, moe_layers)), what);
  }
}

// The core attention swapped in the spec alone (the config still says flash): the unfused core gives the same
// model up to summation order.
TEST(GPTLayerSpecs, CoreAttentionSwappedInTheSpec) {
  for (const auto& [what, c] : configs()) {
    GPTModelSpec unfused = get_gpt_model_spec(c);
    unfused.decoder.layer_specs.push_back(unfused.mtp_layer.transformer_layer);  // the MTP depth's layer too
    for (TransformerLayerSpec& l : unfused.decoder.layer_specs) {
      l.core_attention = "unfused";
      l.make_core_attention = core_attention_factory("unfused");
    }
    unfused.mtp_layer.transformer_layer = unfused.decoder.layer_specs.back();
    unfused.decoder.layer_specs.pop_back();
    const SpecRun a = run(c, get_gpt_model_spec(c)), b = run(c, unfused);
    EXPECT_EQ(a.keys, b.keys) << what;
    // fp32, blockwise online softmax vs the materialized softmax: ~1e-7 relative on the loss.
    EXPECT_NEAR(a.loss, b.loss, 1e-5 * std::abs(a.loss)) << what;
    for (size_t i = 0; i < a.grads.size(); ++i)
      for (int64_t j = 0; j < a.grads[i].numel(); ++j)  // same bound, absolute on O(1e-2) gradients
        ASSERT_NEAR(a.grads[i].data<float>()[j], b.grads[i].data<float>()[j], 1e-5) << what << " " << a.keys[i];
    // The unfused core keeps its [b*np, s, s] probabilities, the flash one its output and log-sum-exp.
    EXPECT_NE(a.context_bytes, b.context_bytes) << what;
  }
}

// A new attention variant, known only to this test: its module, its Ctx and its visit_ctx_tensors overload, plugged
// in through the spec (AttentionOf). It delegates to SelfAttention and counts its calls.
struct CountingAttentionCtx {
  SelfAttentionCtx inner;
};
void visit_ctx_tensors(const CountingAttentionCtx& c, const TensorVisitor& f) { mcpp::visit_ctx_tensors(c.inner, f); }

int g_forwards = 0, g_backwards = 0;

class CountingAttention {
 public:
  CountingAttention(ParameterRegistry& params, const std::string& prefix, const TransformerConfig& c,
                    const TransformerLayerSpec& spec, const tensor_parallel::TPContext& tp)
      : inner_(params, prefix, c, spec, tp) {}
  Tensor forward(CountingAttentionCtx& ctx, const Tensor& x, const RopeTables* rope, const ForwardOptions& opt) const {
    ++g_forwards;
    return inner_.forward(ctx.inner, x, rope, opt);
  }
  Tensor backward(CountingAttentionCtx& ctx, const Tensor& dy, const RopeTables* rope, bool bias_elsewhere) const {
    ++g_backwards;
    return inner_.backward(ctx.inner, dy, rope, bias_elsewhere);
  }
  Parameter* output_bias() const { return inner_.output_bias(); }
  void release_input(CountingAttentionCtx& ctx) const { inner_.release_input(ctx.inner); }
  void restore_input(CountingAttentionCtx& ctx, const Tensor& x) const { inner_.restore_input(ctx.inner, x); }

 private:
  SelfAttention inner_;
};

TEST(GPTLayerSpecs, NewAttentionVariantNeedsOnlyTheSpec) {
  const TransformerConfig c = configs()[0].second;  // MoE layers and an MTP depth: every layer kind
  GPTModelSpec spec = get_gpt_model_spec(c);
  const AttentionFactory counting = [](ParameterRegistry& params, const std::string& prefix,
                                       const TransformerConfig& cfg, const TransformerLayerSpec& s,
                                       const tensor_parallel::TPContext& tp) -> std::unique_ptr<AttentionModule> {
    return std::make_unique<AttentionOf<CountingAttention, CountingAttentionCtx>>(params, prefix, cfg, s, tp);
  };
  for (TransformerLayerSpec& l : spec.decoder.layer_specs) l.attention = "counting", l.make_attention = counting;
  spec.mtp_layer.transformer_layer.make_attention = counting;
  g_forwards = g_backwards = 0;
  const SpecRun counted = run(c, spec);
  const int64_t layers = c.num_layers + c.mtp_num_layers;
  EXPECT_EQ(g_forwards, layers);
  EXPECT_EQ(g_backwards, layers);
  expect_same_run(run(c, get_gpt_model_spec(c)), counted, "counting attention");  // its context walked too
}

// The MTP depth's norms come from its spec: a GPT-2-style model (LayerNorm everywhere, RoPE) whose MTP enorm is an
// RMSNorm built by the spec alone. Only that norm changes: no bias parameter, and the rest of the model's
// parameters unchanged (the same keys, in order, minus that one).
TEST(GPTLayerSpecs, MtpNormsComeFromTheSpec) {
  TransformerConfig c = testing::tiny_config("gpt2");
  c.position_embedding_type = PositionEmbedding::Rope;  // MTP needs rope or none (Megatron's rule)
  c.mtp_num_layers = 1;
  c.validate();
  ASSERT_EQ(c.normalization, Normalization::LayerNorm);
  GPTModelSpec spec = get_gpt_model_spec(c);
  const float eps = c.norm_epsilon;
  int built = 0;
  spec.mtp_layer.make_enorm = [&built, eps](ParameterRegistry& params, const std::string& prefix, int64_t hidden,
                                            bool sequence_parallel) {
    ++built;
    return Norm(params, prefix, hidden, Normalization::RMSNorm, eps, sequence_parallel);
  };
  const SpecRun a = run(c, get_gpt_model_spec(c)), b = run(c, spec);
  EXPECT_EQ(built, 1);  // one depth, one enorm
  const std::string bias = "mtp.layers.0.enorm.bias";
  ASSERT_NE(std::find(a.keys.begin(), a.keys.end(), bias), a.keys.end());
  EXPECT_EQ(std::find(b.keys.begin(), b.keys.end(), bias), b.keys.end());
  std::vector<std::string> expected = a.keys;
  expected.erase(std::find(expected.begin(), expected.end(), bias));
  EXPECT_EQ(b.keys, expected);
  EXPECT_EQ(a.loss, b.loss);  // the reported loss is the main head's; the depth changes only gradients
  const auto grad_of = [](const SpecRun& r, const std::string& key) {
    return r.grads[std::find(r.keys.begin(), r.keys.end(), key) - r.keys.begin()];
  };
  const std::string eh = "mtp.layers.0.eh_proj.weight";  // eh_proj reads concat(enorm(e), hnorm(h))
  EXPECT_FALSE(bitwise_equal(grad_of(a, eh), grad_of(b, eh)));
}

// ---- The layers' linears: "fp8" | "local" per layer (Megatron's --first-last-layers-bf16).

// The FP8 state's keys (tensor_parallel/fp8_state.h: "<linear>.fp8.<input|weight|grad_output>.<scale|...>") of a
// model built from `spec`.
std::vector<std::string> fp8_state_keys(const TransformerConfig& c, const GPTModelSpec& spec) {
  ModelChunk model(spec, c, 11, testing::single_tp());
  std::vector<std::string> keys;
  for (ParamAndGradBuffer* buf : model.buffers())
    for (const auto& [key, t] : buf->rank_states())
      if (key.find(".fp8.") != std::string::npos) keys.push_back(key);
  return keys;
}

bool has_key_with(const std::vector<std::string>& keys, const std::string& part) {
  return std::any_of(keys.begin(), keys.end(), [&](const std::string& k) { return k.find(part) != std::string::npos; });
}

// 4 Llama layers (MoE with a shared expert on layers 1 and 3: the shared expert's linears are the layer's) and an
// MTP depth, FP8 hybrid with delayed scaling.
TransformerConfig fp8_model(bool first_last_bf16, int64_t start, int64_t end) {
  TransformerConfig c = testing::tiny_config("llama");
  c.num_layers = 4;
  c.num_moe_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 16;
  c.moe_shared_expert_intermediate_size = 32;
  c.moe_layer_freq = "[0,1,0,1]";
  c.mtp_num_layers = 1;
  c.fp8_format = "hybrid";
  c.fp8_recipe = "delayed";
  c.fp8_amax_history_len = 4;
  c.first_last_layers_bf16 = first_last_bf16;
  c.num_layers_at_start_in_bf16 = start;
  c.num_layers_at_end_in_bf16 = end;
  c.validate();
  return c;
}

// Every layer in bf16 (start = num_layers, end 0): the FP8 model is the model without FP8, bit for bit, and keeps no
// FP8 state.
TEST(GPTLayerSpecs, FirstLastBf16OverAllLayersIsTheModelWithoutFp8) {
  const TransformerConfig c = fp8_model(true, 4, 0);
  TransformerConfig off = c;
  off.fp8_format.clear();
  off.first_last_layers_bf16 = false;
  const GPTModelSpec spec = get_gpt_model_spec(c);
  for (const TransformerLayerSpec& l : spec.decoder.layer_specs) {
    EXPECT_EQ(l.linear, "local");
    EXPECT_FALSE(l.linear_fp8.enabled);
  }
  EXPECT_EQ(spec.mtp_layer.transformer_layer.linear, "local");
  EXPECT_TRUE(fp8_state_keys(c, spec).empty());
  expect_same_run(run(off, get_gpt_model_spec(off)), run(c, spec), "all layers bf16 vs no FP8");
  // The flags are no-ops without FP8 (Megatron's): FP8 off, the same spec names.
  TransformerConfig off_flags = off;
  off_flags.first_last_layers_bf16 = true;
  for (const TransformerLayerSpec& l : get_gpt_model_spec(off_flags).decoder.layer_specs) EXPECT_EQ(l.linear, "local");
}

// 4 layers, start 1 / end 1: layers 0 and 3 (and the MTP depth, which takes the last layer's spec) keep their linears
// in the model's dtype, layers 1-2 run FP8 with state. The run is bitwise that of a spec assembled by hand with
// "local" / "fp8" per layer, built with a config that does not set the flag (the modules read only the spec), and
// differs from the all-FP8 run.
TEST(GPTLayerSpecs, FirstAndLastLayersKeepLocalLinears) {
  const TransformerConfig c = fp8_model(true, 1, 1), all_fp8 = fp8_model(false, 1, 1);
  const GPTModelSpec spec = get_gpt_model_spec(c);
  const std::vector<std::string> expected{"local", "fp8", "fp8", "local"};
  std::vector<std::string> linears;
  for (const TransformerLayerSpec& l : spec.decoder.layer_specs) {
    linears.push_back(l.linear);
    EXPECT_EQ(l.linear_fp8.enabled, l.linear == "fp8");
  }
  EXPECT_EQ(linears, expected);
  EXPECT_EQ(spec.mtp_layer.transformer_layer.linear, "local");
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(c.is_first_last_bf16_layer(i), i == 0 || i == 3) << i;

  const std::vector<std::string> keys = fp8_state_keys(c, spec);
  EXPECT_FALSE(has_key_with(keys, "decoder.layers.0."));
  EXPECT_FALSE(has_key_with(keys, "decoder.layers.3."));
  EXPECT_FALSE(has_key_with(keys, "mtp.layers.0."));
  for (const std::string layer : {"decoder.layers.1.", "decoder.layers.2."})
    for (const std::string linear : {"self_attention.linear_qkv.fp8.", "self_attention.linear_proj.fp8."})
      EXPECT_TRUE(has_key_with(keys, layer + linear)) << layer + linear;
  EXPECT_TRUE(has_key_with(keys, "decoder.layers.1.mlp.shared_experts.linear_fc1.fp8."));
  EXPECT_TRUE(has_key_with(keys, "decoder.layers.2.mlp.linear_fc2.fp8."));
  EXPECT_FALSE(has_key_with(keys, "local_experts"));  // routed experts: never FP8
  // All FP8: every layer and the MTP depth keep state.
  const std::vector<std::string> all_keys = fp8_state_keys(all_fp8, get_gpt_model_spec(all_fp8));
  for (const std::string prefix : {"decoder.layers.0.", "decoder.layers.3.", "mtp.layers.0."})
    EXPECT_TRUE(has_key_with(all_keys, prefix)) << prefix;

  const GPTModelSpec by_hand = assembled(all_fp8, {false, true, false, true}, expected);
  const SpecRun mixed = run(c, spec);
  expect_same_run(mixed, run(all_fp8, by_hand), "first/last bf16 vs assembled local/fp8 spec");
  const SpecRun fp8 = run(all_fp8, get_gpt_model_spec(all_fp8));
  EXPECT_EQ(fp8.keys, mixed.keys);
  EXPECT_NE(fp8.loss, mixed.loss);  // layers 0 and 3 no longer cast to FP8
  TransformerConfig off = c;
  off.fp8_format.clear();
  EXPECT_NE(run(off, get_gpt_model_spec(off)).loss, mixed.loss);  // layers 1-2 still do
}

TEST(GPTLayerSpecs, UnknownLinearImplementationIsRefused) {
  TransformerConfig c = testing::tiny_config("llama");
  c.validate();
  TransformerLayerSpec l;
  EXPECT_THROW(set_layer_linear(l, "fp8", c), Error);  // FP8 off
  try {
    set_layer_linear(l, "te", c);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'te' (expected local|fp8)"), std::string::npos) << e.what();
  }
}

TEST(GPTLayerSpecs, UnknownCoreAttentionNamesRegistered) {
  try {
    core_attention_factory("cudnn_magic");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cudnn_magic"), std::string::npos) << msg;
    EXPECT_NE(msg.find("flash, unfused"), std::string::npos) << msg;
  }
}

// A layer handed the context another implementation filled fails naming the mistake (no silent reinterpretation).
TEST(GPTLayerSpecs, SubmoduleCtxOfAnotherTypeIsRefused) {
  SubmoduleCtx box;
  box.get<MLPCtx>();
  EXPECT_NE(box.as<MLPCtx>(), nullptr);
  EXPECT_EQ(box.as<SelfAttentionCtx>(), nullptr);
  EXPECT_THROW(box.get<SelfAttentionCtx>(), Error);
  SubmoduleCtx copy = box;  // a copy holds its own Ctx
  EXPECT_NE(copy.as<MLPCtx>(), box.as<MLPCtx>());
  box.reset();
  EXPECT_TRUE(box.empty());
  EXPECT_FALSE(copy.empty());
}

}  // namespace
}  // namespace mcpp
