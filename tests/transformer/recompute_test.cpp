// Activation recompute (full uniform / full block / selective) vs no recompute on one rank, with hidden and
// attention dropout on (unfused attention, and the flash attention's in-tile mask): the losses, every parameter gradient and the RNG streams after
// the step are bitwise identical — the recomputed forward replays the original dropout keys. Two
// microbatches run forward, forward, backward, backward so a recompute happens while another microbatch's
// draws already advanced the live streams. The contexts hold fewer bytes with recompute, and the
// recomputed layers' contexts are really empty between forward and backward; two microbatches' contexts
// share no storage (the schedule runner sums per-context bytes).
#include <gtest/gtest.h>

#include <cstring>
#include <tuple>

#include "mcpp/distributed/model_chunk.h"
#include "mcpp/models/gpt/gpt_model.h"
#include "mcpp/pipeline_parallel/activation_memory.h"
#include "mcpp/transformer/attention.h"
#include "models/gpt_test_util.h"

namespace mcpp {
namespace {

struct RunResult {
  std::vector<double> losses;
  std::vector<Tensor> grads;  // per parameter, in registration order
  nlohmann::json rng_state;
  size_t context_bytes = 0;  // one microbatch's context after its forward
  std::vector<bool> layer_ctx_empty;  // per layer of microbatch 0, after the forward
  std::vector<bool> mlp_ctx_empty;    // per layer: the MLP's context dropped (selective mlp / moe)
  std::vector<bool> norm_out_released;  // per layer: no norm output kept (selective layernorm)
};

TransformerConfig recompute_config(const std::string& style, const std::string& granularity, const std::string& method,
                                   int64_t n, const std::string& attention_impl = "unfused",
                                   const std::vector<std::string>& modules = {"core_attn"}, bool moe = false) {
  TransformerConfig c = testing::tiny_config(style);
  c.recompute_modules = modules;
  if (moe) {  // MoE in layers 0 and 2, dense layer 1; a shared expert, aux + z losses
    c.num_moe_experts = 4;
    c.moe_router_topk = 2;
    c.moe_ffn_hidden_size = 16;
    c.moe_layer_freq = "[1,0,1]";
    c.moe_shared_expert_intermediate_size = 24;
    c.moe_aux_loss_coeff = 0.01f;
    c.moe_z_loss_coeff = 0.001f;
    c.moe_input_jitter_eps = style == "gpt2" ? 0.05f : 0.1f;  // training noise the re-run must draw again
    c.moe_router_force_load_balancing = style == "gpt2";
  }
  c.num_layers = 3;
  c.hidden_dropout = 0.1f;
  c.attention_dropout = 0.2f;
  c.attention_impl = attention_impl;
  c.recompute_granularity = granularity;
  c.recompute_method = method;
  c.recompute_num_layers = n;
  c.validate();
  return c;
}

RunResult run(const TransformerConfig& c, bool training = true) {
  ModelChunk model(c, 7, testing::single_tp());
  tensor_parallel::RngTracker rng(1234, 0, 0);
  const ForwardOptions opt{.training = training, .rng = &rng};
  RunResult r;
  std::vector<GPTModelCtx> ctx(2);
  std::vector<testing::Batch> batches;
  for (uint64_t m = 0; m < 2; ++m) batches.push_back(testing::fixed_batch(c.seq_length, 2, c.vocab_size, m));
  for (size_t m = 0; m < 2; ++m) {
    r.losses.push_back(model.forward_loss(ctx[m], batches[m].tokens, batches[m].labels, batches[m].loss_mask, opt).loss);
    if (m == 0) {
      r.context_bytes = pipeline_parallel::context_bytes(ctx[0]);
      for (const auto& l : ctx[0].decoder.layers) {
        const MLPCtx* mlp = l.mlp.as<MLPCtx>();                  // a dense layer's (null when dropped)
        const moe::MoELayerCtx* moe = l.mlp.as<moe::MoELayerCtx>();  // a MoE layer's
        const SelfAttentionCtx* attn = l.self_attention.as<SelfAttentionCtx>();
        r.layer_ctx_empty.push_back(!l.input_layernorm.x.defined());
        r.mlp_ctx_empty.push_back(!(mlp && mlp->fc2.x.defined()) && !(moe && moe->combined.defined()) &&
                                  l.mlp_dropped);
        // linear_qkv's input, the MLP's fc1 input or the MoE router's and shared expert's, the MLP's kept input
        const bool mlp_in = (mlp && mlp->fc1.x.defined()) ||
                            (moe && (moe->router.x.defined() || moe->shared.fc1.x.defined() ||
                                     moe->shared_input.defined())) ||
                            l.mlp_input.defined();
        r.norm_out_released.push_back(!(attn && attn->qkv.x.defined()) && !mlp_in);
      }
    }
  }
  // The schedule runner sums per-context bytes: two microbatches' contexts must share no storage.
  EXPECT_EQ(pipeline_parallel::context_bytes({&ctx[0], &ctx[1]}),
            pipeline_parallel::context_bytes(ctx[0]) + pipeline_parallel::context_bytes(ctx[1]));
  for (size_t m = 0; m < 2; ++m) model.backward(ctx[m], 0.5f);
  for (ParamAndGradBuffer* buf : model.buffers())  // the MoE experts' buffer too
    for (const auto& p : buf->params()) r.grads.push_back(p->main_grad.clone());
  r.rng_state = rng.state();
  return r;
}

void expect_bitwise_equal(const RunResult& a, const RunResult& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << what << " loss " << i;
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i)
    EXPECT_EQ(0, std::memcmp(a.grads[i].raw(), b.grads[i].raw(), a.grads[i].nbytes())) << what << " grad " << i;
  EXPECT_EQ(a.rng_state, b.rng_state) << what << " RNG streams after the step";
}

TEST(Recompute, FullAndSelectiveEqualNoRecomputeWithDropout) {
  for (const std::string impl : {"unfused", "flash"})
    for (const std::string style : {"gpt2", "llama"}) {
      const std::string run_name = impl + " " + style;
      const RunResult off = run(recompute_config(style, "", "", 0, impl));
      // Dropout really is on: without it the loss differs (else the test could not see a wrong mask).
      EXPECT_NE(off.losses[0], run(recompute_config(style, "", "", 0, impl), /*training=*/false).losses[0]) << run_name;
      struct Case {
        std::string granularity, method;
        int64_t n;
        std::vector<bool> empty;  // which layer contexts are dropped after the forward
      };
      const std::vector<Case> cases = {{"full", "uniform", 1, {true, true, true}},
                                       {"full", "uniform", 2, {true, true, true}},  // groups {0,1}, {2}
                                       {"full", "uniform", 3, {true, true, true}},
                                       {"full", "block", 2, {true, true, false}},
                                       {"full", "block", 1, {true, false, false}},
                                       {"selective", "", 0, {false, false, false}}};
      for (const Case& k : cases) {
        const std::string what = run_name + " " + k.granularity + " " + k.method + " " + std::to_string(k.n);
        const RunResult on = run(recompute_config(style, k.granularity, k.method, k.n, impl));
        expect_bitwise_equal(off, on, what);
        EXPECT_EQ(on.layer_ctx_empty, k.empty) << what;
        EXPECT_LT(on.context_bytes, off.context_bytes) << what << ": recompute must hold fewer activation bytes";
      }
    }
}

// --qk-layernorm under recompute: selective (the core attention re-run from the normalized, rotated q / k kept) and
// full (the norms re-run with the layer) give the bits of no recompute, with dropout, both norm kinds.
TEST(Recompute, QkLayernormFullAndSelectiveEqualNoRecompute) {
  for (const std::string style : {"gpt2", "llama"}) {
    auto qk = [&](const std::string& granularity, const std::string& method, int64_t n) {
      TransformerConfig c = recompute_config(style, granularity, method, n, "flash");
      c.qk_layernorm = true;
      return c;
    };
    const RunResult off = run(qk("", "", 0));
    for (const auto& [granularity, method, n] : std::vector<std::tuple<std::string, std::string, int64_t>>{
             {"selective", "", 0}, {"full", "uniform", 1}, {"full", "block", 2}}) {
      const RunResult on = run(qk(granularity, method, n));
      expect_bitwise_equal(off, on, style + " qk-layernorm " + granularity + " " + method);
      EXPECT_LT(on.context_bytes, off.context_bytes) << style << " " << granularity;
    }
  }
}

// Multi-latent attention under recompute: "mla_up_proj" (query / key / value rebuilt from the up projections' kept
// inputs), with "core_attn" (the core re-run on them too) and "layernorm" (the down projections' inputs re-normed), and
// full recompute give the bits of no recompute, with dropout, both core attentions and both MLA styles; each holds
// fewer bytes.
TEST(Recompute, MultiLatentAttentionEqualsNoRecompute) {
  for (const std::string style : {"llama", "gpt2"})
    for (const std::string impl : {"flash", "unfused"}) {
      auto mla = [&](const std::string& granularity, const std::string& method, int64_t n,
                     const std::vector<std::string>& modules) {
        TransformerConfig c = recompute_config(style, "", "", 0, impl);  // (validated without MLA first)
        c.recompute_granularity = granularity, c.recompute_method = method, c.recompute_num_layers = n;
        c.recompute_modules = modules;
        testing::enable_mla(c, testing::mla_tiny_dims(style));
        c.validate();
        return c;
      };
      const RunResult off = run(mla("", "", 0, {"core_attn"}));
      for (const auto& [granularity, method, n, modules] :
           std::vector<std::tuple<std::string, std::string, int64_t, std::vector<std::string>>>{
               {"selective", "", 0, {"mla_up_proj"}},
               {"selective", "", 0, {"mla_up_proj", "core_attn"}},
               {"selective", "", 0, {"mla_up_proj", "layernorm"}},
               {"selective", "", 0, {"core_attn"}},
               {"full", "uniform", 1, {"core_attn"}}}) {
        const std::string what = style + " " + impl + " MLA " + granularity + " " + modules[0] +
                                 (modules.size() > 1 ? " + " + modules[1] : "");
        const RunResult on = run(mla(granularity, method, n, modules));
        expect_bitwise_equal(off, on, what);
        EXPECT_LT(on.context_bytes, off.context_bytes) << what;
      }
    }
}

TEST(Recompute, FullUniformHoldsLessThanBlockOfOne) {
  // Held bytes order: every layer recomputed (one kept input per layer) < only the first layer recomputed.
  const size_t all = run(recompute_config("gpt2", "full", "uniform", 1)).context_bytes;
  const size_t first = run(recompute_config("gpt2", "full", "block", 1)).context_bytes;
  const size_t grouped = run(recompute_config("gpt2", "full", "uniform", 3)).context_bytes;
  EXPECT_LT(all, first);
  EXPECT_LT(grouped, all);  // one kept input for the whole group instead of one per layer
}

// Selective recompute of the MLP ("mlp": dense layers) and of the MoE layer ("moe": router, dispatch, experts, the
// shared expert), alone and with the core attention, on a model with MoE layers 0 and 2 and dense layer 1 (aux and z
// losses: the recompute must rebuild the router's statistics without recording the losses twice; the router's input
// jitter, and in gpt2 random logits: it must replay their draws): bitwise the plain run's losses, grads and RNG
// streams; only the named layers' MLP contexts dropped (moe_act: the experts' activation outputs only;
// shared_experts: the shared expert's context); fewer bytes held. Full recompute of that model too.
TEST(Recompute, SelectiveMlpAndMoeEqualNoRecompute) {
  for (const std::string style : {"gpt2", "llama"}) {
    const RunResult off = run(recompute_config(style, "", "", 0, "flash", {"core_attn"}, true));
    struct Case {
      std::vector<std::string> modules;
      std::vector<bool> mlp_empty;
    };
    // moe_act: every routed expert's activation output dropped (fc1's output kept), the layers' contexts kept
    for (const Case& k : {Case{{"mlp"}, {false, true, false}}, Case{{"moe"}, {true, false, true}},
                          Case{{"core_attn", "mlp", "moe"}, {true, true, true}}, Case{{"moe_act"}, {false, false, false}},
                          Case{{"core_attn", "moe_act", "mlp"}, {false, true, false}},
                          Case{{"shared_experts"}, {false, false, false}},
                          Case{{"moe_act", "shared_experts", "moe"}, {true, false, true}}}) {
      std::string what = style;
      for (const auto& m : k.modules) what += " " + m;
      const RunResult on = run(recompute_config(style, "selective", "", 0, "flash", k.modules, true));
      expect_bitwise_equal(off, on, what);
      EXPECT_EQ(on.mlp_ctx_empty, k.mlp_empty) << what;
      EXPECT_LT(on.context_bytes, off.context_bytes) << what;
    }
    expect_bitwise_equal(off, run(recompute_config(style, "full", "uniform", 2, "flash", {"core_attn"}, true)),
                         style + " full uniform");
  }
}

// Selective recompute "layernorm" (input_layernorm's and pre_mlp_layernorm's outputs released after the forward and
// re-run from the norms' kept inputs in backward), alone and with every other module, dense (dropout on: the fused
// add + dropout + norm's sum is the re-run's input) and on the MoE model (the router's and the shared expert's input,
// a gated shared expert's gate reading the router's): bitwise the plain run's losses, grads and RNG streams; no norm
// output kept by any layer; fewer bytes held than the same modules without "layernorm".
TEST(Recompute, LayernormEqualsNoRecompute) {
  for (const std::string style : {"gpt2", "llama"})
    for (const bool moe : {false, true}) {
      const std::string impl = moe ? "flash" : "unfused";
      auto config = [&](const std::string& granularity, const std::vector<std::string>& modules) {
        TransformerConfig c = recompute_config(style, granularity, "", 0, impl, modules, moe);
        c.moe_shared_expert_gate = moe;  // the gate reads the router's input
        return c;
      };
      const RunResult off = run(config("", {"core_attn"}));
      using Modules = std::vector<std::string>;
      const std::vector<Modules> sets =
          moe ? std::vector<Modules>{{"layernorm"}, {"layernorm", "moe"}, {"layernorm", "shared_experts"},
                                     {"core_attn", "moe_act", "layernorm", "mlp", "moe", "shared_experts"}}
              : std::vector<Modules>{{"layernorm"}, {"layernorm", "core_attn"}, {"mlp", "layernorm"}};
      for (Modules modules : sets) {
        std::string what = style + (moe ? " moe" : " dense");
        for (const auto& m : modules) what += " " + m;
        TransformerConfig c = config("selective", modules);
        const RunResult on = run(c);
        expect_bitwise_equal(off, on, what);
        EXPECT_EQ(on.norm_out_released, std::vector<bool>(3, true)) << what;
        std::erase(modules, "layernorm");
        if (modules.empty()) modules = {"core_attn"};
        c.recompute_modules = modules;
        const RunResult without = run(c);
        EXPECT_EQ(without.norm_out_released, std::vector<bool>(3, false)) << what;
        EXPECT_LT(on.context_bytes, without.context_bytes) << what;
      }
    }
}

// With --qk-layernorm (the attention's own norms are not "layernorm"'s: their contexts stay).
TEST(Recompute, LayernormWithQkLayernormEqualsNoRecompute) {
  for (const std::string style : {"gpt2", "llama"}) {
    auto qk = [&](const std::string& granularity, const std::vector<std::string>& modules) {
      TransformerConfig c = recompute_config(style, granularity, "", 0, "flash", modules);
      c.qk_layernorm = true;
      return c;
    };
    const RunResult off = run(qk("", {"core_attn"}));
    const RunResult on = run(qk("selective", {"layernorm", "core_attn"}));
    expect_bitwise_equal(off, on, style + " qk-layernorm layernorm");
    EXPECT_EQ(on.norm_out_released, std::vector<bool>(3, true)) << style;
  }
}

}  // namespace
}  // namespace mcpp
