// Shared helpers of the HF conversion tests (hf_*_test.cpp): a random model checkpoint of a key list, the DeepSeek
// test models, and one small model of each HF format's family.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist_checkpointing/ckpt_test_util.h"
#include "mcpp/dist_checkpointing/checkpoint.h"
#include "mcpp/dist_checkpointing/hf_convert.h"
#include "mcpp/training/config.h"
#include "models/gpt_test_util.h"

namespace mcpp::dist_checkpointing::testing {

// A checkpoint of random tensors with the exact key list and meta.config = config; the vocabulary's padding rows
// (rows >= vocab of the word embeddings and the output layer) are zero: export drops them and import pads zeros, so
// only then is the round trip the identity.
inline CheckpointContents random_checkpoint(const nlohmann::json& config,
                                            const std::vector<std::pair<std::string, Shape>>& tensors, int64_t vocab,
                                            int64_t iteration, uint32_t seed) {
  CheckpointContents c;
  c.iteration = iteration;
  c.meta = {{"config", config}};
  for (const auto& [key, shape] : tensors) {
    Tensor t = random_tensor(shape, DType::F32, seed++);
    if (key == "embedding.word_embeddings.weight" || key == "output_layer.weight")
      t.narrow0(vocab, shape[0] - vocab).zero_();
    c.tensors.push_back({key, t});
  }
  return c;
}

// DeepSeek V3: 2 layers (layer 0 dense), MLA 4 heads with query compression, YaRN factor 4 over 8 positions (max 32),
// 4 experts top-2 in 2 groups of which 1 is kept (top-2 = 2 x 1: HF's group ranking), routed scaling 2.5, expert bias,
// a shared expert of 2 experts' width, one MTP depth, untied. V2: linear_q_proj, plain RoPE, 8 experts top-2
// pre-softmax in 4 groups of which 2 are kept (group_limited_greedy: top-k = topk_group), tied, no MTP.
inline Config ds_config(bool v3) {
  Config c;
  TransformerConfig& m = c.model;
  m = mcpp::testing::tiny_config("llama");  // RMSNorm 1e-6, SwiGLU, RoPE, untied, no biases; vocab 100 -> 128
  m.num_query_groups = m.num_attention_heads;
  m.seq_length = 16, m.max_position_embeddings = 32;
  m.multi_latent_attention = true, m.qk_layernorm = true;
  m.q_lora_rank = v3 ? 16 : 0, m.kv_lora_rank = 12, m.qk_head_dim = 6, m.qk_pos_emb_head_dim = 4, m.v_head_dim = 8;
  m.num_moe_experts = v3 ? 4 : 8, m.moe_layer_freq = "[0,1]", m.moe_ffn_hidden_size = 8, m.moe_router_topk = 2;
  m.moe_shared_expert_intermediate_size = 16;
  if (v3) {
    m.rope_type = "yarn", m.rotary_scaling_factor = 4.0f, m.original_max_position_embeddings = 8;
    m.mscale = 1.0f, m.mscale_all_dim = 1.0f;
    m.moe_router_score_function = "sigmoid", m.moe_router_enable_expert_bias = true;
    m.moe_router_num_groups = 2, m.moe_router_group_topk = 1, m.moe_router_topk_scaling_factor = 2.5f;
    m.mtp_num_layers = 1;
  } else {
    m.rope_type = "rope", m.untie_embeddings_and_output_weights = false, m.moe_router_pre_softmax = true;
    m.moe_router_num_groups = 4, m.moe_router_group_topk = 2, m.moe_router_topk_scaling_factor = 1.5f;
  }
  c.finalize();
  return c;
}

// A small model the format writes: GPT-2 (tied, biases, learned positions); Llama (GQA, untied); Qwen2 (Llama + q/k/v
// biases); Qwen3 (Llama + q/k norms, head dim 12 != hidden / heads); Mixtral (4 experts top-2 in every layer);
// Qwen2-MoE (a MoE layer with a gated shared expert, a dense layer, q/k/v biases); Qwen3-MoE (q/k norms, a dense layer
// then a MoE layer); DeepSeek V2 / V3 (ds_config).
inline Config hf_family_config(HfFormat f) {
  if (f == HfFormat::DeepseekV2 || f == HfFormat::DeepseekV3) return ds_config(f == HfFormat::DeepseekV3);
  Config c;
  TransformerConfig& m = c.model;
  m = mcpp::testing::tiny_config(f == HfFormat::Gpt2 ? "gpt2" : "llama");
  m.add_qkv_bias = f == HfFormat::Qwen2 || f == HfFormat::Qwen2Moe;
  if (f == HfFormat::Qwen3 || f == HfFormat::Qwen3Moe) m.qk_layernorm = true, m.kv_channels = 12;
  if (f == HfFormat::Mixtral || f == HfFormat::Qwen2Moe || f == HfFormat::Qwen3Moe) {
    m.num_moe_experts = 4, m.moe_router_topk = 2, m.moe_ffn_hidden_size = 16;
    if (f == HfFormat::Qwen2Moe)
      m.moe_layer_freq = "[1,0]", m.moe_shared_expert_intermediate_size = 24, m.moe_shared_expert_gate = true;
    if (f == HfFormat::Qwen3Moe) m.moe_layer_freq = "[0,1]";
  }
  c.finalize();
  return c;
}

}  // namespace mcpp::dist_checkpointing::testing
