// Megatron's num_floating_point_operations (training/flops.h) against hand counts of every GEMM of a training step
// (forward = 2 m n k per GEMM; backward = twice the forward; causal attention scores half of the s x s), for GPT-2,
// Llama-style (GQA + SwiGLU), MoE (top-k routed + shared experts, a dense first layer, an MTP depth) and MLA
// configs; the closed forms for plain GPT (Narayanan et al.) with and without full recompute, and how DESIGN.md's
// 72 B s L h^2 (1 + s/(6h) + V/(16 L h)) differs; the GPU peak table and --peak-tflops.
#include "mcpp/training/flops.h"

#include <gtest/gtest.h>

namespace mcpp {
namespace {

// Exact up to double rounding of sums of integers below 2^53 (the counts are ~1e15..1e18).
constexpr double kRel = 1e-12;

Config gpt(int64_t L, int64_t h, int64_t heads, int64_t s, int64_t V) {
  Config c;
  TransformerConfig& m = c.model;
  m.num_layers = L, m.hidden_size = h, m.num_attention_heads = heads, m.num_query_groups = heads;
  m.kv_channels = h / heads, m.ffn_hidden_size = 4 * h, m.seq_length = s, m.padded_vocab_size = V;
  return c;
}

// The hand count: 3 passes x sum over the GEMMs of 2 m n k, per sample of s tokens.
struct Hand {
  double s;
  double total = 0;
  void gemm(double m, double n, double k) { total += 3.0 * 2.0 * m * n * k; }
  void linear(double in, double out) { gemm(s, out, in); }      // [s, in] x [in, out]
  void attention(double heads, double qk_dim, double v_dim) {  // causal: half of the s x s scores and sums
    gemm(s, s, heads * qk_dim / 2.0);                          // QK^T over every head
    gemm(s, heads * v_dim, s / 2.0);                           // softmax(QK^T) V
  }
};

TEST(Flops, Gpt2MatchesTheGemmsOfAStep) {
  const int64_t L = 12, h = 768, heads = 12, s = 1024, V = 50304, B = 32;  // GPT-2 124M
  Hand hand{.s = s};
  for (int64_t l = 0; l < L; ++l) {
    hand.linear(h, 3 * h);  // linear_qkv
    hand.attention(heads, h / heads, h / heads);
    hand.linear(h, h);      // linear_proj
    hand.linear(h, 4 * h);  // linear_fc1
    hand.linear(4 * h, h);  // linear_fc2
  }
  hand.linear(h, V);  // output_layer
  EXPECT_NEAR(num_floating_point_operations(gpt(L, h, heads, s, V), B), B * hand.total, kRel * B * hand.total);
}

TEST(Flops, LlamaGqaSwiglu) {
  Config c = gpt(24, 2048, 16, 2048, 50304);
  TransformerConfig& m = c.model;
  m.num_query_groups = 4, m.kv_channels = 128, m.swiglu = true, m.ffn_hidden_size = 5440;
  const double h = 2048, d = 128, nq = 16, ng = 4, f = 5440;
  Hand hand{.s = 2048};
  for (int l = 0; l < 24; ++l) {
    hand.linear(h, (nq + 2 * ng) * d);  // q, and k, v of the 4 groups
    hand.attention(nq, d, d);
    hand.linear(nq * d, h);
    hand.linear(h, 2 * f);  // SwiGLU: gate and up
    hand.linear(f, h);
  }
  hand.linear(h, 50304);
  EXPECT_NEAR(num_floating_point_operations(c, 8), 8 * hand.total, kRel * 8 * hand.total);
}

TEST(Flops, MoeTopKSharedExpertDenseFirstLayerAndMtp) {
  Config c = gpt(4, 1024, 8, 512, 32768);
  TransformerConfig& m = c.model;
  m.swiglu = true, m.ffn_hidden_size = 2816;
  m.num_moe_experts = 16, m.moe_router_topk = 4, m.moe_ffn_hidden_size = 512;
  m.moe_shared_expert_intermediate_size = 1024, m.moe_layer_freq = "[0,1,1,1]";
  m.mtp_num_layers = 1;  // one more layer of the last kind (MoE), eh_proj and one more logits pass
  const double h = 1024, s = 512, V = 32768;
  Hand hand{.s = s};
  auto attention_block = [&] {
    hand.linear(h, 3 * h);
    hand.attention(8, 128, 128);
    hand.linear(h, h);
  };
  auto swiglu_mlp = [&](double f) {
    hand.linear(h, 2 * f);
    hand.linear(f, h);
  };
  attention_block();
  swiglu_mlp(2816);        // layer 0: dense
  for (int l = 1; l < 5; ++l) {  // layers 1..3 and the MTP depth's layer: MoE
    attention_block();
    for (int k = 0; k < 4; ++k) swiglu_mlp(512);  // each token's 4 routed experts (the router's GEMM uncounted)
    swiglu_mlp(1024);                             // the shared expert
  }
  hand.linear(2 * h, h);          // MTP eh_proj
  hand.total += 3 * 2 * s * 3 * h;  // Megatron counts the depth's norms as 3h multiply-adds per token
  hand.linear(h, V);              // the main logits
  hand.linear(h, V);              // the depth's logits
  EXPECT_NEAR(num_floating_point_operations(c, 2), 2 * hand.total, kRel * 2 * hand.total);
}

TEST(Flops, MultiLatentAttention) {
  Config c = gpt(2, 2048, 16, 1024, 32000);
  TransformerConfig& m = c.model;
  m.multi_latent_attention = true, m.q_lora_rank = 1536, m.kv_lora_rank = 512, m.qk_head_dim = 128;
  m.qk_pos_emb_head_dim = 64, m.v_head_dim = 128;
  const double h = 2048, n = 16, ql = 1536, kl = 512, dn = 128, dr = 64, dv = 128;
  Hand hand{.s = 1024};
  for (int l = 0; l < 2; ++l) {
    hand.linear(h, ql);                // linear_q_down_proj
    hand.linear(ql, n * (dn + dr));    // linear_q_up_proj
    hand.linear(h, kl + dr);           // linear_kv_down_proj (latent + the shared rotary key)
    hand.linear(kl, n * (dn + dv));    // linear_kv_up_proj
    hand.attention(n, dn + dr, dv);
    hand.linear(n * dv, h);            // linear_proj
    hand.total += 3 * 2 * 1024 * (ql + kl);  // Megatron's "+1": each latent norm as a multiply-add per element
    hand.linear(h, 4 * h);             // the dense GELU MLP (ffn 4h): fc1 ...
    hand.linear(4 * h, h);             // ... and fc2
  }
  hand.linear(h, 32000);
  EXPECT_NEAR(num_floating_point_operations(c, 4), 4 * hand.total, kRel * 4 * hand.total);
  m.q_lora_rank = 0;  // no query compression: linear_q_proj h -> n (dn + dr)
  Hand plain{.s = 1024};
  for (int l = 0; l < 2; ++l) {
    plain.linear(h, n * (dn + dr));
    plain.linear(h, kl + dr);
    plain.linear(kl, n * (dn + dv));
    plain.attention(n, dn + dr, dv);
    plain.linear(n * dv, h);
    plain.total += 3 * 2 * 1024 * kl;
    plain.linear(h, 4 * h);
    plain.linear(4 * h, h);
  }
  plain.linear(h, 32000);
  EXPECT_NEAR(num_floating_point_operations(c, 4), 4 * plain.total, kRel * 4 * plain.total);
}

TEST(Flops, PlainGptClosedFormsAndDesignFormula) {
  for (auto [L, h, heads, s, V, B] : {std::array<int64_t, 6>{12, 768, 12, 1024, 50304, 32},
                                      std::array<int64_t, 6>{24, 2048, 16, 2048, 50304, 8}}) {
    Config c = gpt(L, h, heads, s, V);
    const double b = static_cast<double>(B), sd = static_cast<double>(s), ld = static_cast<double>(L),
                 hd = static_cast<double>(h), vd = static_cast<double>(V);
    const double base = b * sd * ld * hd * hd;
    // Narayanan et al. (2021) with the causal mask halving the s^2 term: 72 (no recompute), 96 (full recompute)
    const double model = 72 * base * (1 + sd / (12 * hd) + vd / (12 * ld * hd));
    EXPECT_NEAR(num_floating_point_operations(c, B), model, kRel * model);
    EXPECT_NEAR(hardware_floating_point_operations(c, B), model, kRel * model);  // nothing recomputed
    c.model.recompute_granularity = "full", c.model.recompute_method = "uniform", c.model.recompute_num_layers = 1;
    const double full = 96 * base * (1 + sd / (12 * hd) + vd / (16 * ld * hd));
    EXPECT_NEAR(hardware_floating_point_operations(c, B), full, kRel * full);
    EXPECT_NEAR(num_floating_point_operations(c, B), model, kRel * model);  // MFU counts the model's math once
    // DESIGN.md's 72 B s L h^2 (1 + s/(6h) + V/(16 L h)) counts the full s x s scores and 3/4 of the logits' passes:
    // it exceeds Megatron's by 6 B L s^2 h and falls short by 1.5 B s h V.
    const double design = 72 * base * (1 + sd / (6 * hd) + vd / (16 * ld * hd));
    const double diff = -6 * b * ld * sd * sd * hd + 1.5 * b * sd * hd * vd;
    EXPECT_NEAR(num_floating_point_operations(c, B) - design, diff, kRel * model);
  }
}

TEST(Flops, SelectiveCoreAttentionRecomputeAddsTheCoreForward) {
  Config c = gpt(12, 768, 12, 1024, 50304);
  c.model.recompute_granularity = "selective";
  c.model.recompute_modules = {"core_attn"};
  Hand core{.s = 1024};
  core.attention(12, 64, 64);  // one layer's core attention, forward + backward
  const double extra = 12 * core.total / 3.0;  // its forward again in each of the 12 layers
  EXPECT_NEAR(hardware_floating_point_operations(c, 4) - num_floating_point_operations(c, 4), 4 * extra,
              1e-9 * 4 * extra);
}

TEST(Flops, PeakTable) {
  EXPECT_EQ(known_gpu_peak_tflops("NVIDIA H100 80GB HBM3"), 989.0);  // SXM5, bf16 dense
  EXPECT_EQ(known_gpu_peak_tflops("NVIDIA H200"), 989.0);
  EXPECT_EQ(known_gpu_peak_tflops("NVIDIA H100 PCIe"), 756.0);
  EXPECT_EQ(known_gpu_peak_tflops("NVIDIA A100-SXM4-80GB"), 312.0);
  EXPECT_EQ(known_gpu_peak_tflops("Tesla T4"), 0.0);
  EXPECT_EQ(known_gpu_peak_tflops(""), 0.0);  // CPU
  EXPECT_EQ(peak_tflops(0.0, "NVIDIA H200", true), 989.0);
  EXPECT_EQ(peak_tflops(0.0, "NVIDIA H200", false), 0.0);  // no bf16 peak for an fp32 run
  EXPECT_EQ(peak_tflops(123.0, "", false), 123.0);          // --peak-tflops wins (e.g. CPU ranks)
}

}  // namespace
}  // namespace mcpp
