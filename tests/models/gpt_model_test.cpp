// Whole GPT vs the float64 PyTorch reference (tests/oracle/gpt_ref.py): logits, loss and every parameter
// gradient, for the GPT-2 style and the Llama style tiny configs.
#include "mcpp/distributed/model_chunk.h"
#include "mcpp/models/gpt/gpt_model.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "mcpp/core/npy.h"
#include "mcpp/tensor_parallel/random.h"
#include "models/gpt_test_util.h"
#include "tests/oracle/oracle_python.h"

namespace mcpp {
namespace {

namespace fs = std::filesystem;

// With dropout the model runs in training mode; the reference rebuilds the masks from the keys our run drew
// (replayed here from a second RngTracker: the default stream gives the embedding's, then per layer the
// attention and mlp branches'; the model-parallel stream each layer's attention probabilities').
void run_against_torch(const std::string& style, const std::string& attention_impl, float hidden_dropout = 0.0f,
                       float attention_dropout = 0.0f, bool qk_layernorm = false, int64_t mtp = 0,
                       bool per_token = false) {
  // "gpt2_rope": the GPT-2 style (tied embeddings, LayerNorm, GELU, biases) with RoPE instead of learned positions
  TransformerConfig c = testing::tiny_config(style == "gpt2_rope" ? "gpt2" : style);
  if (style == "gpt2_rope") c.position_embedding_type = PositionEmbedding::Rope;
  if (style == "mla_llama" || style == "mla_gpt2") {
    c = testing::mla_tiny_config(style == "mla_llama" ? "llama" : "gpt2");
  }
  if (style == "llama_scaled") {  // Llama 3.1's RoPE scaling, a base at which every band of it is reached
    c = testing::tiny_config("llama");
    c.use_rope_scaling = true;
    c.rope_scaling_factor = 8.0f;
    c.rotary_base = 1e6f;
    c.max_position_embeddings = 4096;
  }
  if (style == "llama_interp") {  // linear position interpolation (Megatron's seq_len_interpolation_factor)
    c = testing::tiny_config("llama");
    c.rotary_seq_len_interpolation_factor = 3.0f;
    c.max_position_embeddings = 4096;
  }
  c.mtp_num_layers = mtp;
  c.mtp_loss_scaling_factor = 0.3f;
  c.calculate_per_token_loss = per_token;
  c.qk_layernorm = qk_layernorm;
  c.attention_impl = attention_impl;
  c.hidden_dropout = hidden_dropout;
  c.attention_dropout = attention_dropout;
  const bool dropout = hidden_dropout > 0 || attention_dropout > 0;
  ModelChunk model(c, 1234, testing::single_tp());
  // Non-trivial norm weights/biases (init is ones/zeros) so their gradients and effect are exercised.
  for (const auto& p : model.params().params())
    if (p->spec.init != InitKind::Normal) init_normal(p->data, 0.3f, 99, p->spec.key), p->data.data<float>()[0] += 1.0f;
  const int64_t s = style == "llama_scaled" || style == "llama_interp" ? 600 : 12, b = 3;  // (scaled RoPE: positions reaching its bands)
  testing::Batch batch = testing::fixed_batch(s, b, c.vocab_size);
  GPTModelCtx ctx;
  tensor_parallel::RngTracker rng(4321, 0, 0);
  MtpLossTracker mtp_losses(mtp);
  // (MTP depths run in training forwards only)
  LossResult r = model.forward_loss(ctx, batch.tokens, batch.labels, batch.loss_mask,
                                    {.training = dropout || mtp > 0, .rng = dropout ? &rng : nullptr,
                                     .mtp_losses = &mtp_losses});
  Tensor logits = ctx.logits.clone();
  model.backward(ctx, 1.0f);

  fs::path dir = fs::temp_directory_path() / fmt::format("mcpp_gpt_ref_{}_{}_{}{}_mtp{}{}_{}", style, attention_impl,
                                                         dropout ? "dropout" : "eval", qk_layernorm ? "_qkln" : "",
                                                         mtp, per_token ? "_pt" : "", ::getpid());
  fs::create_directories(dir);
  nlohmann::json cfg = {{"hidden_size", c.hidden_size},
                        {"num_layers", c.num_layers},
                        {"num_attention_heads", c.num_attention_heads},
                        {"num_query_groups", c.num_query_groups},
                        {"kv_channels", c.kv_channels},
                        {"norm_epsilon", c.norm_epsilon},
                        {"normalization", c.normalization == Normalization::LayerNorm ? "LayerNorm" : "RMSNorm"},
                        {"position_embedding_type",
                         c.position_embedding_type == PositionEmbedding::Rope ? "rope" : "learned_absolute"},
                        {"rotary_percent", c.rotary_percent},
                        {"rotary_base", c.rotary_base},
                        {"rope_scaling_factor", c.use_rope_scaling ? c.rope_scaling_factor : 0.0f},
                        {"rotary_seq_len_interpolation_factor", c.rotary_seq_len_interpolation_factor},
                        {"swiglu", c.swiglu},
                        {"qk_layernorm", c.qk_layernorm},
                        {"mtp_num_layers", c.mtp_num_layers},
                        {"mtp_loss_scaling_factor", c.mtp_loss_scaling_factor},
                        {"calculate_per_token_loss", c.calculate_per_token_loss},
                        {"multi_latent_attention", c.multi_latent_attention},
                        {"q_lora_rank", c.q_lora_rank},
                        {"kv_lora_rank", c.kv_lora_rank},
                        {"qk_head_dim", c.qk_head_dim},
                        {"qk_pos_emb_head_dim", c.qk_pos_emb_head_dim},
                        {"v_head_dim", c.v_head_dim},
                        {"rope_type", c.mla_yarn() ? "yarn" : "rope"},
                        {"rotary_scaling_factor", c.rotary_scaling_factor},
                        {"mscale", c.mscale},
                        {"mscale_all_dim", c.mscale_all_dim},
                        {"beta_fast", c.beta_fast},
                        {"beta_slow", c.beta_slow},
                        {"original_max_position_embeddings", c.original_max_position_embeddings}};
  if (dropout) {
    tensor_parallel::RngTracker replay(4321, 0, 0);
    auto key = [](PhiloxKey k) { return nlohmann::json::array({k.seed, k.offset}); };
    const auto hidden = static_cast<uint64_t>(s * b * c.hidden_size);
    nlohmann::json d = {{"hidden", hidden_dropout}, {"attention", attention_dropout}};
    d["embedding"] = key(replay.draw_default(hidden));
    for (int64_t l = 0; l < c.num_layers; ++l) {
      nlohmann::json layer;
      layer["probs"] = key(replay.draw_model_parallel(static_cast<uint64_t>(b * c.num_attention_heads * s * s)));
      layer["attn"] = key(replay.draw_default(hidden));
      layer["mlp"] = key(replay.draw_default(hidden));
      d["layers"].push_back(layer);
    }
    for (int64_t k = 0; k < mtp; ++k) {  // each depth: its embedding's, then its transformer layer's
      nlohmann::json depth;
      depth["embedding"] = key(replay.draw_default(hidden));
      depth["probs"] = key(replay.draw_model_parallel(static_cast<uint64_t>(b * c.num_attention_heads * s * s)));
      depth["attn"] = key(replay.draw_default(hidden));
      depth["mlp"] = key(replay.draw_default(hidden));
      d["mtp"].push_back(depth);
    }
    cfg["dropout"] = d;
  }
  std::vector<std::string> keys;
  for (const auto& p : model.params().params()) {
    keys.push_back(p->spec.key);
    save_npy((dir / (p->spec.key + ".npy")).string(), p->data);
    save_npy((dir / ("grad." + p->spec.key + ".npy")).string(), p->main_grad);
  }
  cfg["param_keys"] = keys;
  std::ofstream(dir / "config.json") << cfg.dump();
  save_npy((dir / "tokens.npy").string(), batch.tokens);
  save_npy((dir / "labels.npy").string(), batch.labels);
  save_npy((dir / "loss_mask.npy").string(), batch.loss_mask);
  save_npy((dir / "logits.npy").string(), logits);
  std::ofstream(dir / "loss.txt") << fmt::format("{:.17g}", r.loss);
  {
    std::ofstream f(dir / "mtp_losses.txt");
    for (const auto& [sum, count] : mtp_losses.take()) {
      EXPECT_EQ(count, 1.0);  // one microbatch recorded per depth
      f << fmt::format("{:.17g}\n", sum);
    }
  }

  std::string cmd =
      fmt::format("{}{}/tests/oracle/gpt_ref.py {} 2>&1", mcpp::test::oracle_python(), MCPP_SOURCE_DIR, dir.string());
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, pipe)) out += buf;
  int rc = pclose(pipe);
  EXPECT_EQ(rc, 0) << out;
  std::cout << out;
  if (rc == 0) fs::remove_all(dir);
}

TEST(GPTModelVsTorch, Gpt2StyleFlash) { run_against_torch("gpt2", "flash"); }
TEST(GPTModelVsTorch, LlamaStyleFlash) { run_against_torch("llama", "flash"); }
TEST(GPTModelVsTorch, Gpt2StyleUnfused) { run_against_torch("gpt2", "unfused"); }
TEST(GPTModelVsTorch, LlamaStyleUnfused) { run_against_torch("llama", "unfused"); }
// Multi-latent attention: Llama style (RMSNorm latent norms, query compression, YaRN with every band of its ramp
// and a softmax mscale, value heads narrower than the query / key ones: padded) and GPT-2 style (LayerNorm latent
// norms with biases, no query compression, plain RoPE, value heads wider: queries / keys padded; with dropout).
TEST(GPTModelVsTorch, MlaLlamaStyleFlash) { run_against_torch("mla_llama", "flash", 0.0f, 0.0f, true); }
// (without --qk-layernorm: no latent norms)
TEST(GPTModelVsTorch, MlaLlamaStyleUnfusedNoLatentNorms) { run_against_torch("mla_llama", "unfused"); }
TEST(GPTModelVsTorch, MlaGpt2StyleFlashWithDropout) { run_against_torch("mla_gpt2", "flash", 0.2f, 0.15f, true); }
TEST(GPTModelVsTorch, MlaLlamaStyleMtp) { run_against_torch("mla_llama", "flash", 0.0f, 0.0f, true, 2); }
// Embedding, hidden (bias-dropout-add inside the norms; the last layer's branch summed apart before the final
// norm) and attention dropout, masks rebuilt by the reference from the drawn keys.
TEST(GPTModelVsTorch, Gpt2StyleFlashWithDropout) { run_against_torch("gpt2", "flash", 0.2f, 0.15f); }
TEST(GPTModelVsTorch, LlamaStyleUnfusedWithDropout) { run_against_torch("llama", "unfused", 0.3f, 0.1f); }
TEST(GPTModelVsTorch, LlamaStyleFlashWithHiddenDropout) { run_against_torch("llama", "flash", 0.25f); }
// --qk-layernorm: RMSNorm (llama, before RoPE, GQA) and LayerNorm with bias (gpt2: learned positions, the packed
// path that qk norms turn off), trained weights on the norms (the loop above randomizes every non-Normal init).
TEST(GPTModelVsTorch, LlamaStyleQkLayernorm) { run_against_torch("llama", "flash", 0.0f, 0.0f, true); }
TEST(GPTModelVsTorch, Gpt2StyleQkLayernormWithDropout) { run_against_torch("gpt2", "flash", 0.2f, 0.15f, true); }
TEST(GPTModelVsTorch, LlamaStyleQkLayernormUnfused) { run_against_torch("llama", "unfused", 0.0f, 0.0f, true); }

// Multi-token prediction (Megatron's MTP): two depths on the rolled tokens / labels / mask, the shared embedding
// and output layer (tied and untied), with dropout in the depths' embeddings and layers, per-token loss scaling.
TEST(GPTModelVsTorch, LlamaStyleMtpTwoDepths) { run_against_torch("llama", "flash", 0.0f, 0.0f, false, 2); }
TEST(GPTModelVsTorch, LlamaStyleMtpWithDropoutUnfused) { run_against_torch("llama", "unfused", 0.2f, 0.1f, false, 2); }
TEST(GPTModelVsTorch, TiedGpt2StyleRopeMtpWithDropout) {
  run_against_torch("gpt2_rope", "flash", 0.2f, 0.15f, false, 2);
}
// Llama 3.1's RoPE scaling (--use-rope-scaling): the scaled frequencies against the reference's float64 ones
TEST(GPTModelVsTorch, LlamaStyleRopeScaling) { run_against_torch("llama_scaled", "flash"); }
// --rotary-seq-len-interpolation-factor 3 (HF rope_type "linear"): positions 0..599 divided by it
TEST(GPTModelVsTorch, LlamaStyleRopePositionInterpolation) { run_against_torch("llama_interp", "flash"); }
TEST(GPTModelVsTorch, LlamaStyleMtpPerTokenQkLayernorm) {
  run_against_torch("llama", "flash", 0.0f, 0.0f, true, 3, /*per_token=*/true);
}

TEST(GPTModel, MegatronInitAndBufferLayout) {
  TransformerConfig c = testing::tiny_config("gpt2");
  ModelChunk model(c, 7, testing::single_tp());
  auto& params = model.params();
  // Backward order: the last registered parameter (final layernorm bias) sits at offset 0.
  EXPECT_EQ(params.params().back()->data.raw(), params.param_buffer().raw());
  // N(0, 0.02) for weights; output projections scaled by 1/sqrt(2L).
  auto stddev = [](const Tensor& t) {
    double s2 = 0;
    for (int64_t i = 0; i < t.numel(); ++i) s2 += double(t.data<float>()[i]) * t.data<float>()[i];
    return std::sqrt(s2 / t.numel());
  };
  EXPECT_NEAR(stddev(params.find("embedding.word_embeddings.weight")->data), 0.02, 0.002);
  EXPECT_NEAR(stddev(params.find("decoder.layers.0.self_attention.linear_proj.weight")->data), 0.02 / 2.0, 0.0015);
  EXPECT_NEAR(stddev(params.find("decoder.layers.1.mlp.linear_fc2.weight")->data), 0.02 / 2.0, 0.0015);
  EXPECT_EQ(params.find("decoder.layers.0.input_layernorm.weight")->data.data<float>()[3], 1.0f);
  EXPECT_EQ(params.find("decoder.layers.0.mlp.linear_fc1.bias")->data.data<float>()[3], 0.0f);
  // Same seed -> same init; init depends on the key, not on the model (a Llama model shares the key).
  ModelChunk again(c, 7, testing::single_tp());
  EXPECT_EQ(0, std::memcmp(again.params().param_buffer().raw(), params.param_buffer().raw(),
                           params.param_buffer().nbytes()));
}

}  // namespace
}  // namespace mcpp

namespace mcpp {
namespace {
// Every parameter reports grad_ready exactly once per backward, in an order where each report comes after
// its gradient is final (the tied embedding last) — what DDP's overlapped bucket reduction relies on.
TEST(GPTModel, GradReadyOncePerParameterPerBackward) {
  for (const std::string style : {"gpt2", "llama"}) {
    TransformerConfig c = testing::tiny_config(style);
    ModelChunk model(c, 5, testing::single_tp());
    std::map<const Parameter*, int> count;
    std::vector<std::string> order;
    std::map<const Parameter*, Tensor> grad_at_ready;
    model.params().set_grad_ready_hook([&](Parameter& p) {
      ++count[&p];
      order.push_back(p.spec.key);
      grad_at_ready[&p] = p.main_grad.clone();
    });
    testing::Batch batch = testing::fixed_batch(12, 2, c.vocab_size);
    GPTModelCtx ctx;
    model.forward_loss(ctx, batch.tokens, batch.labels, batch.loss_mask, {.training = false});
    model.backward(ctx, 1.0f);
    ASSERT_EQ(count.size(), model.params().params().size()) << style;
    for (const auto& p : model.params().params()) {
      EXPECT_EQ(count[p.get()], 1) << style << " " << p->spec.key;
      EXPECT_EQ(0, std::memcmp(grad_at_ready[p.get()].raw(), p->main_grad.raw(), p->main_grad.nbytes()))
          << style << " " << p->spec.key << " changed after it reported ready";
    }
    EXPECT_EQ(order.front(), c.untie_embeddings_and_output_weights ? "output_layer.weight" : "decoder.final_layernorm.weight");
  }
}

// ParamAndGradBuffer::set_overwrite_main_grad: a buffer full of NaN "stale" values, zero_grad (which then
// only marks), two microbatches of backward and zero_stale_grads give the gradients of the zeroed buffer
// (equal values; -0 == +0) — every writer of a main grad either overwrites it or zeroes it first: linears
// (weights, biases), norms (also the residual bias grads they sum), embeddings (the tied word embedding
// written first by the output layer), GPT-2 and Llama styles, with and without hidden dropout. And the
// saving is real: no linear weight (nor the tied embedding, which the output layer writes first) is zeroed —
// only norm params, biases summed elsewhere and scatter-added embeddings are.
TEST(GPTModel, OverwriteMainGradEqualsAccumulatingIntoAZeroedBuffer) {
  for (const std::string style : {"gpt2", "gpt2_dropout", "llama"}) {
    TransformerConfig c = testing::tiny_config(style == "llama" ? "llama" : "gpt2");
    if (style == "gpt2_dropout") c.hidden_dropout = 0.1f;
    std::map<std::string, Tensor> grads[2];
    for (int overwrite = 0; overwrite < 2; ++overwrite) {
      ModelChunk model(c, 5, testing::single_tp());
      ParamAndGradBuffer& buf = model.params();
      buf.set_overwrite_main_grad(overwrite == 1);
      Tensor& g = buf.grad_buffer();
      for (int64_t i = 0; i < g.numel(); ++i) g.data<float>()[i] = std::nanf("");
      buf.zero_grad();
      tensor_parallel::RngTracker rng(1234, 0, 0);
      for (uint64_t micro = 0; micro < 2; ++micro) {
        testing::Batch batch = testing::fixed_batch(12, 2, c.vocab_size, micro);
        GPTModelCtx ctx;
        model.forward_loss(ctx, batch.tokens, batch.labels, batch.loss_mask, {.training = true, .rng = &rng});
        model.backward(ctx, 0.5f);
      }
      buf.zero_stale_grads();
      if (overwrite == 1) {
        int64_t overwritten = 0;  // the linear weights, and the tied word embedding
        for (const auto& p : buf.params()) {
          const std::string& k = p->spec.key;
          const bool linear_weight = k.find(".linear_") != std::string::npos && k.ends_with(".weight");
          const bool tied = !c.untie_embeddings_and_output_weights && k == "embedding.word_embeddings.weight";
          if (linear_weight || k == "output_layer.weight" || tied) overwritten += p->main_grad.numel();
        }
        EXPECT_GT(buf.stale_grads_zeroed(), 0) << style;  // the norms accumulate: zeroed first
        EXPECT_LE(buf.stale_grads_zeroed(), buf.numel() - overwritten) << style << " of " << buf.numel();
      } else {
        EXPECT_EQ(buf.stale_grads_zeroed(), 0) << style;  // zero_grad cleared the buffer at once
      }
      for (const auto& p : buf.params()) {
        EXPECT_FALSE(p->grad_stale) << style << " " << p->spec.key;
        grads[overwrite][p->spec.key] = p->main_grad.clone();
      }
    }
    for (const auto& [key, g] : grads[0]) {
      const Tensor& h = grads[1][key];
      int64_t differ = 0;
      for (int64_t i = 0; i < g.numel(); ++i) differ += !(g.data<float>()[i] == h.data<float>()[i]);
      EXPECT_EQ(differ, 0) << style << " " << key;
    }
  }
}

// Without hidden dropout, linear_fc2's and linear_proj's bias grads are summed inside pre_mlp_layernorm's
// fused backward (ResidualBiasGrads), so they report ready right after that norm's own parameters. With
// dropout (bias-dropout-add inside the norms) linear_proj's still rides in pre_mlp_layernorm (over the dattn
// it writes), and linear_fc2's stays in the linear's backward (wherever the mlp branch's dropout ran).
// Both give the same gradients when the dropout draws nothing (p = 0 is "no dropout", so p tiny: masks
// almost surely all-ones at this size, and the comparison is to tolerance).
TEST(GPTModel, ResidualBiasGradsRideInTheFusedNorms) {
  std::map<std::string, Tensor> grads[2];
  for (int with_dropout = 0; with_dropout < 2; ++with_dropout) {
    TransformerConfig c = testing::tiny_config("gpt2");
    c.num_layers = 3;
    c.hidden_dropout = with_dropout ? 1e-9f : 0.0f;
    ModelChunk model(c, 5, testing::single_tp());
    std::vector<std::string> order;
    model.params().set_grad_ready_hook([&](Parameter& p) { order.push_back(p.spec.key); });
    testing::Batch batch = testing::fixed_batch(12, 2, c.vocab_size);
    GPTModelCtx ctx;
    tensor_parallel::RngTracker rng(1234, 0, 0);
    model.forward_loss(ctx, batch.tokens, batch.labels, batch.loss_mask, {.training = true, .rng = &rng});
    model.backward(ctx, 1.0f);
    auto at = [&](const std::string& key) {
      auto it = std::find(order.begin(), order.end(), key);
      EXPECT_NE(it, order.end()) << key;
      return it - order.begin();
    };
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const std::string p = fmt::format("decoder.layers.{}.", l);
      const auto norm_bias = at(p + "pre_mlp_layernorm.bias");
      if (!with_dropout) {
        EXPECT_EQ(at(p + "mlp.linear_fc2.bias"), norm_bias + 1) << l;
        EXPECT_EQ(at(p + "self_attention.linear_proj.bias"), norm_bias + 2) << l;
      } else {
        EXPECT_EQ(at(p + "self_attention.linear_proj.bias"), norm_bias + 1) << l;
        EXPECT_EQ(at(p + "mlp.linear_fc2.bias"), at(p + "mlp.linear_fc2.weight") + 1) << l;
      }
    }
    for (const auto& p : model.params().params()) grads[with_dropout][p->spec.key] = p->main_grad.clone();
  }
  for (const auto& [key, g] : grads[0]) {
    const Tensor& h = grads[1][key];
    double worst = 0;
    for (int64_t i = 0; i < g.numel(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(g.data<float>()[i]) - h.data<float>()[i]) /
                                  (1e-3 + std::abs(static_cast<double>(h.data<float>()[i]))));
    EXPECT_LT(worst, 1e-4) << key;
  }
}
}  // namespace
}  // namespace mcpp

namespace mcpp {
namespace {
// Pipeline stages: a model split into 3 stages (embedding + layer 0 | layer 1 | layer 2 + head), run in
// sequence with hidden states and gradients handed over, gives the full model's loss and gradients; the
// tied word embeddings' two copies (first and last stage) sum to the full gradient. Also in training mode
// with embedding, hidden and attention dropout (the stages draw from one RNG stream in the full model's
// order): the full model adds each layer's dropped mlp branch inside the next norm, the stages sum it apart
// at their ends and back-propagate its dropout there — bitwise the same.
TEST(GPTModel, PipelineStagesComposeToTheFullModel) {
  for (const std::string style : {"gpt2", "llama", "gpt2 dropout", "llama dropout"}) {
    const bool dropout = style.ends_with("dropout");
    TransformerConfig c = testing::tiny_config(style.starts_with("gpt2") ? "gpt2" : "llama");
    c.num_layers = 3;
    if (dropout) c.hidden_dropout = 0.2f, c.attention_dropout = 0.1f;
    tensor_parallel::RngTracker rng_full(77, 0, 0), rng_stages(77, 0, 0);
    const ForwardOptions of{.training = dropout, .rng = dropout ? &rng_full : nullptr};
    const ForwardOptions os{.training = dropout, .rng = dropout ? &rng_stages : nullptr};
    ModelChunk full(c, 11, testing::single_tp());
    ModelChunk s0(c, 11, testing::single_tp(), Device::CPU, {.pre_process = true, .post_process = false, .first_layer = 0, .num_layers = 1});
    ModelChunk s1(c, 11, testing::single_tp(), Device::CPU, {.pre_process = false, .post_process = false, .first_layer = 1, .num_layers = 1});
    ModelChunk s2(c, 11, testing::single_tp(), Device::CPU, {.pre_process = false, .post_process = true, .first_layer = 2, .num_layers = 1});
    testing::Batch bt = testing::fixed_batch(12, 2, c.vocab_size);
    GPTModelCtx cf, c0, c1, c2;
    LossResult rf = full.forward_loss(cf, bt.tokens, bt.labels, bt.loss_mask, of);
    full.backward(cf, 1.0f);
    LossResult r2;
    Tensor h0 = s0.forward_step(c0, bt.tokens, Tensor(), Tensor(), Tensor(), os, nullptr);
    Tensor h1 = s1.forward_step(c1, bt.tokens, h0, Tensor(), Tensor(), os, nullptr);
    EXPECT_FALSE(s2.forward_step(c2, bt.tokens, h1, bt.labels, bt.loss_mask, os, &r2).defined());
    EXPECT_EQ(r2.loss, rf.loss) << style;
    EXPECT_EQ(rng_stages.state(), rng_full.state()) << style;
    if (dropout) {
      EXPECT_NE(rng_full.state(), tensor_parallel::RngTracker(77, 0, 0).state()) << "nothing drawn";
    }
    Tensor g1 = s2.backward_step(c2, 1.0f, Tensor());
    Tensor g0 = s1.backward_step(c1, 1.0f, g1);
    EXPECT_FALSE(s0.backward_step(c0, 1.0f, g0).defined());
    for (ModelChunk* stage : {&s0, &s1, &s2})
      for (const auto& p : stage->params().params()) {
        const Parameter* f = full.params().find(p->spec.key);
        ASSERT_NE(f, nullptr) << p->spec.key;
        EXPECT_EQ(0, std::memcmp(p->data.raw(), f->data.raw(), p->data.nbytes())) << "init differs: " << p->spec.key;
        if (p->spec.key == "embedding.word_embeddings.weight" && !c.untie_embeddings_and_output_weights) continue;
        EXPECT_EQ(0, std::memcmp(p->main_grad.raw(), f->main_grad.raw(), p->main_grad.nbytes())) << style << " " << p->spec.key;
      }
    if (!c.untie_embeddings_and_output_weights) {
      Parameter* e0 = s0.params().find("embedding.word_embeddings.weight");
      Parameter* e2 = s2.params().find("embedding.word_embeddings.weight");
      ASSERT_TRUE(e0 && e2);
      EXPECT_FALSE(e0->spec.shared_copy);
      EXPECT_TRUE(e2->spec.shared_copy);
      const Tensor& gf = full.params().find("embedding.word_embeddings.weight")->main_grad;
      for (int64_t i = 0; i < gf.numel(); ++i)  // two fp32 partial sums added in another order: 1e-6 relative
        ASSERT_NEAR(e0->main_grad.data<float>()[i] + e2->main_grad.data<float>()[i], gf.data<float>()[i],
                    1e-6 + 1e-5 * std::abs(gf.data<float>()[i])) << style << " tied grad " << i;
    } else {
      EXPECT_EQ(s2.params().find("embedding.word_embeddings.weight"), nullptr);
    }
  }
}
}  // namespace
}  // namespace mcpp
