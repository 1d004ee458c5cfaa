// FP8 linears under activation recompute (tensor_parallel/fp8_recompute.h) on the CPU backend (emulated casts): full
// recompute (uniform, block), selective recompute of the mlp / moe / shared_experts (alone, with "layernorm", the
// shared expert's region nested inside the recomputed MoE layer) and full recompute of the multi-token-prediction
// depth give bitwise the losses, every parameter gradient and the FP8 scaling state (scales and amax histories) of
// the run without recompute — for the delayed recipe (hybrid formats, history 4, max) and the tensorwise one. Two
// rounds of two microbatches each run forward, forward, backward, backward: a recompute happens after the other
// microbatch's forward moved the live scales (the test checks they moved), so a re-run that cast with the live
// scales, or updated the state (the amax history) a second time, would differ. Also what an FP8 linear's context
// holds between forward and backward (the saved casts, not x) and that the activation walk counts it.
// Under the delayed recipe the run without recompute applies the layers' norms in their linears' FP8 input casts
// (transformer_layer.h) and "layernorm" recompute does not, so the bitwise comparison with {"layernorm", "mlp"} is
// also that of the norms in the casts against the norms written out; NormsInTheCastsWhereTheyMay checks which runs
// apply them.
#include <gtest/gtest.h>

#include <cstring>

#include "mcpp/core/error.h"
#include "mcpp/distributed/model_chunk.h"
#include "mcpp/models/gpt/gpt_model.h"
#include "mcpp/transformer/ctx_tensors.h"
#include "mcpp/transformer/mlp.h"
#include "models/gpt_test_util.h"

namespace mcpp {
namespace {

struct Fp8Run {
  std::vector<double> losses;
  std::vector<Tensor> grads;                              // per parameter of round 2, in registration order
  std::vector<std::pair<std::string, Tensor>> fp8_state;  // every rank state after the run
  bool scales_moved_between_forwards = false;  // the live scales at mb 0's recompute differ from those it cast with
};

std::vector<std::pair<std::string, Tensor>> snapshot(ModelChunk& model) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (ParamAndGradBuffer* buf : model.buffers())
    for (const auto& [key, t] : buf->rank_states()) out.emplace_back(key, t->clone());
  return out;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

Fp8Run run(const TransformerConfig& c) {
  ModelChunk model(c, 7, testing::single_tp());
  tensor_parallel::RngTracker rng(1234, 0, 0);
  const ForwardOptions opt{.training = true, .rng = &rng};
  Fp8Run r;
  for (uint64_t round = 0; round < 2; ++round) {
    std::vector<GPTModelCtx> ctx(2);
    const auto before = snapshot(model);  // the scales microbatch 0 casts with (delayed)
    for (size_t m = 0; m < 2; ++m) {
      const testing::Batch b = testing::fixed_batch(c.seq_length, 2, c.vocab_size, 2 * round + m);
      r.losses.push_back(model.forward_loss(ctx[m], b.tokens, b.labels, b.loss_mask, opt).loss);
      if (m == 1) {  // ... against the live ones when its recompute runs
        const auto after = snapshot(model);
        for (size_t i = 0; i < after.size(); ++i)
          r.scales_moved_between_forwards |=
              after[i].first.ends_with(".scale") && !bitwise_equal(before[i].second, after[i].second);
      }
    }
    for (ParamAndGradBuffer* buf : model.buffers()) buf->zero_grad();
    for (size_t m = 0; m < 2; ++m) model.backward(ctx[m], 0.5f);
  }
  for (ParamAndGradBuffer* buf : model.buffers())
    for (const auto& p : buf->params()) r.grads.push_back(p->main_grad.clone());
  r.fp8_state = snapshot(model);
  return r;
}

void expect_bitwise_equal(const Fp8Run& a, const Fp8Run& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << what << " loss " << i;
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) EXPECT_TRUE(bitwise_equal(a.grads[i], b.grads[i])) << what << " grad " << i;
  ASSERT_EQ(a.fp8_state.size(), b.fp8_state.size()) << what;
  for (size_t i = 0; i < a.fp8_state.size(); ++i) {
    EXPECT_EQ(a.fp8_state[i].first, b.fp8_state[i].first) << what;
    EXPECT_TRUE(bitwise_equal(a.fp8_state[i].second, b.fp8_state[i].second)) << what << " " << a.fp8_state[i].first;
  }
}

struct Layout {
  std::string granularity, method;
  int64_t n = 0;
  std::vector<std::string> modules;
};

TransformerConfig fp8_config(const std::string& style, const std::string& recipe, const Layout& l, bool moe,
                             bool mtp) {
  TransformerConfig c = testing::tiny_config(style);
  c.num_layers = 3;
  c.hidden_dropout = 0.1f;  // the re-run must replay the masks too
  if (moe) {  // MoE in layers 0 and 2 with a shared expert (FP8; the routed experts are not), dense layer 1
    c.num_moe_experts = 4;
    c.moe_router_topk = 2;
    c.moe_ffn_hidden_size = 16;
    c.moe_layer_freq = "[1,0,1]";
    c.moe_shared_expert_intermediate_size = 24;
    c.moe_aux_loss_coeff = 0.01f;
  }
  if (mtp) c.mtp_num_layers = 1;
  c.fp8_format = "hybrid";
  c.fp8_recipe = recipe;
  c.fp8_amax_history_len = 4;
  c.fp8_amax_compute_algo = "max";
  c.recompute_granularity = l.granularity;
  c.recompute_method = l.method;
  c.recompute_num_layers = l.n;
  c.recompute_modules = l.modules.empty() ? std::vector<std::string>{"core_attn"} : l.modules;
  c.validate();
  return c;
}

std::string name_of(const std::string& style, const std::string& recipe, const Layout& l) {
  std::string s = style + " " + recipe + " " + l.granularity + " " + l.method + " " + std::to_string(l.n);
  for (const auto& m : l.modules) s += " " + m;
  return s;
}

TEST(Fp8Recompute, FullAndSelectiveEqualNoRecomputeBitwise) {
  for (const std::string recipe : {"delayed", "tensorwise"})
    for (const std::string style : {"gpt2", "llama"}) {
      const Fp8Run off = run(fp8_config(style, recipe, {}, false, false));
      if (recipe == "delayed") {  // the live scales moved between a microbatch's forward and its recompute
        EXPECT_TRUE(off.scales_moved_between_forwards) << style;
      }
      EXPECT_EQ(off.fp8_state.size(), 3u * 4 * 2 * 3) << "3 layers x 4 linears x (input, weight, grad) x 2 tensors";
      for (const Layout& l : {Layout{"full", "uniform", 1, {}}, Layout{"full", "uniform", 2, {}},
                              Layout{"full", "block", 2, {}}, Layout{"selective", "", 0, {"mlp"}},
                              Layout{"selective", "", 0, {"layernorm", "mlp"}}}) {
        const std::string what = name_of(style, recipe, l);
        expect_bitwise_equal(off, run(fp8_config(style, recipe, l, false, false)), what);
      }
    }
}

TEST(Fp8Recompute, MoeSharedExpertsAndMtpEqualNoRecomputeBitwise) {
  for (const std::string recipe : {"delayed", "tensorwise"}) {
    for (const std::string style : {"gpt2", "llama"}) {
      const Fp8Run off = run(fp8_config(style, recipe, {}, true, false));
      for (const Layout& l : {Layout{"selective", "", 0, {"moe"}}, Layout{"selective", "", 0, {"shared_experts"}},
                              Layout{"selective", "", 0, {"shared_experts", "mlp", "layernorm"}},
                              Layout{"selective", "", 0, {"moe", "shared_experts"}},  // nested: shared inside moe
                              Layout{"full", "uniform", 2, {}}}) {
        const std::string what = "moe " + name_of(style, recipe, l);
        expect_bitwise_equal(off, run(fp8_config(style, recipe, l, true, false)), what);
      }
    }
    // The MTP depth (llama: RoPE) under full uniform recompute: the depth's transformer layer is re-run too.
    const Fp8Run off = run(fp8_config("llama", recipe, {}, false, true));
    expect_bitwise_equal(off, run(fp8_config("llama", recipe, {"full", "uniform", 1, {}}, false, true)),
                         "mtp llama " + recipe + " full uniform 1");
  }
}

// An FP8 (per-tensor) linear's forward keeps the backward's casts (ops::Fp8Saved) and drops its input x; the
// activation walk (ctx_tensors.h: the measured context bytes) counts the saved casts; the backward frees them.
// Blockwise keeps x and saves nothing.
TEST(Fp8Recompute, LinearContextsHoldTheSavedCastsNotTheInput) {
  for (const std::string recipe : {"delayed", "blockwise"}) {
    TransformerConfig c = fp8_config("gpt2", recipe, {}, false, false);
    if (recipe == "blockwise") {  // every GEMM dim a multiple of 128
      c.hidden_size = 128, c.ffn_hidden_size = 256, c.num_attention_heads = 4, c.seq_length = 64;
      c.max_position_embeddings = 64, c.kv_channels = 32;
      c.fp8_format = "e4m3";
      c.validate();
    }
    ModelChunk model(c, 7, testing::single_tp());
    tensor_parallel::RngTracker rng(1234, 0, 0);
    GPTModelCtx ctx;
    const testing::Batch b = testing::fixed_batch(c.seq_length, 2, c.vocab_size, 0);
    model.forward_loss(ctx, b.tokens, b.labels, b.loss_mask, {.training = true, .rng = &rng});
    const tensor_parallel::ParallelLinearCtx& fc2 = ctx.decoder.layers[0].mlp.get<MLPCtx>().fc2;
    int64_t walked = 0;
    tensor_parallel::visit_ctx_tensors(fc2, [&](const Tensor& t) { walked += t.defined() ? t.nbytes() : 0; });
    if (recipe == "blockwise") {
      EXPECT_TRUE(fc2.x.defined() && !fc2.fp8_saved.x.defined());
      EXPECT_EQ(walked, fc2.x.nbytes());
    } else {
      ASSERT_TRUE(!fc2.x.defined() && fc2.fp8_saved.x.defined() && fc2.fp8_saved.w.defined());
      EXPECT_EQ(fc2.rows, c.seq_length * 2);
      EXPECT_EQ(walked, fc2.fp8_saved.x.nbytes() + fc2.fp8_saved.w.nbytes());
    }
    for (ParamAndGradBuffer* buf : model.buffers()) buf->zero_grad();
    model.backward(ctx, 1.0f);
    EXPECT_FALSE(ctx.decoder.layers[0].mlp.get<MLPCtx>().fc2.fp8_saved.x.defined()) << recipe;
  }
}

// Which layers apply their norms in the FP8 casts (TransformerLayerCtx::*_in_cast after a training forward): under the
// delayed recipe input_layernorm in linear_qkv's cast and pre_mlp_layernorm in a dense MLP's fc1 cast; not a MoE
// layer's (the router reads the norm's output), not under the tensorwise recipe (its amax is taken before the cast),
// not with "layernorm" recompute, and not the MLP's under "mlp" recompute (its re-run reads the kept norm output).
TEST(Fp8Recompute, NormsInTheCastsWhereTheyMay) {
  struct Case {
    std::string style, recipe;
    Layout layout;
    bool moe;
    bool attn_in_cast, dense_mlp_in_cast;
  };
  for (const Case& k : {Case{"gpt2", "delayed", {}, false, true, true}, Case{"llama", "delayed", {}, false, true, true},
                        Case{"llama", "delayed", {}, true, true, true},
                        Case{"gpt2", "tensorwise", {}, false, false, false},
                        Case{"gpt2", "delayed", {"selective", "", 0, {"layernorm"}}, false, false, false},
                        Case{"gpt2", "delayed", {"selective", "", 0, {"mlp"}}, false, true, false}}) {
    const std::string what = (k.moe ? "moe " : "") + name_of(k.style, k.recipe, k.layout);
    const TransformerConfig c = fp8_config(k.style, k.recipe, k.layout, k.moe, false);
    ModelChunk model(c, 7, testing::single_tp());
    tensor_parallel::RngTracker rng(1234, 0, 0);
    GPTModelCtx ctx;
    const testing::Batch b = testing::fixed_batch(c.seq_length, 2, c.vocab_size, 0);
    model.forward_loss(ctx, b.tokens, b.labels, b.loss_mask, {.training = true, .rng = &rng});
    ASSERT_EQ(ctx.decoder.layers.size(), 3u) << what;
    for (size_t i = 0; i < 3; ++i) {
      const bool moe_layer = k.moe && i != 1;  // MoE in layers 0 and 2 (fp8_config)
      EXPECT_EQ(ctx.decoder.layers[i].input_norm_in_cast, k.attn_in_cast) << what << " layer " << i;
      EXPECT_EQ(ctx.decoder.layers[i].mlp_norm_in_cast, k.dense_mlp_in_cast && !moe_layer) << what << " layer " << i;
    }
    for (ParamAndGradBuffer* buf : model.buffers()) buf->zero_grad();
    model.backward(ctx, 1.0f);
  }
}

// A re-run that asks for more FP8 linears than its first forward recorded, or another linear, is a named error (the
// replay relies on the re-run calling the same linears in the same order).
TEST(Fp8Recompute, StashChecksTheOrder) {
  tensor_parallel::Fp8ScaleStash s;
  const int a = 0, b = 0;
  s.push(&a, Tensor::zeros({2}), Tensor::zeros({2}));
  EXPECT_THROW(s.take(&b, "linear_b"), Error);
  tensor_parallel::Fp8ScaleStash t;
  t.push(&a, Tensor::zeros({2}), Tensor::zeros({2}));
  EXPECT_NO_THROW(t.take(&a, "linear_a"));
  EXPECT_TRUE(t.consumed());
  EXPECT_THROW(t.take(&a, "linear_a"), Error);
}

}  // namespace
}  // namespace mcpp
