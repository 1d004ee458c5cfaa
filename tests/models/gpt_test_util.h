// Tiny GPT configs (GPT-2 style and Llama style) and a fixed batch, shared by model tests.
#pragma once
#include <string>

#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/core/tensor.h"
#include "mcpp/tensor_parallel/tp_context.h"
#include "mcpp/transformer/transformer_config.h"

namespace mcpp::testing {

inline TransformerConfig tiny_config(const std::string& style) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.kv_channels = 8;
  c.seq_length = 12;
  c.max_position_embeddings = 16;
  c.vocab_size = 100;
  c.padded_vocab_size = 128;
  c.hidden_dropout = 0.0f;
  c.attention_dropout = 0.0f;
  if (style == "gpt2") {
    c.num_query_groups = 4;
    c.ffn_hidden_size = 128;
    c.normalization = Normalization::LayerNorm;
    c.position_embedding_type = PositionEmbedding::LearnedAbsolute;
  } else {  // llama: RoPE, RMSNorm, SwiGLU, GQA, no biases, untied
    c.num_query_groups = 2;
    c.ffn_hidden_size = 48;
    c.normalization = Normalization::RMSNorm;
    c.norm_epsilon = 1e-6f;
    c.swiglu = true;
    c.position_embedding_type = PositionEmbedding::Rope;
    c.untie_embeddings_and_output_weights = true;
    c.add_bias_linear = false;
  }
  return c;
}

// Multi-latent attention on a config (MHA: one latent key / value head per query head; RoPE positions), with these
// dims and RoPE settings; with_norms: the latent norms (--qk-layernorm).
struct MlaDims {
  int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_head_dim = 0, qk_pos_emb_head_dim = 0, v_head_dim = 0;
  std::string rope_type = "yarn";
  float rotary_scaling_factor = 1.0f, mscale = 1.0f, mscale_all_dim = 0.0f, beta_fast = 32.0f;
  int64_t original_max_position_embeddings = 4096;
};
inline void enable_mla(TransformerConfig& c, const MlaDims& d, bool with_norms = true) {
  c.position_embedding_type = PositionEmbedding::Rope;
  c.num_query_groups = c.num_attention_heads;
  c.multi_latent_attention = true;
  c.qk_layernorm = with_norms;
  c.q_lora_rank = d.q_lora_rank, c.kv_lora_rank = d.kv_lora_rank, c.qk_head_dim = d.qk_head_dim;
  c.qk_pos_emb_head_dim = d.qk_pos_emb_head_dim, c.v_head_dim = d.v_head_dim;
  c.rope_type = d.rope_type, c.rotary_scaling_factor = d.rotary_scaling_factor, c.mscale = d.mscale;
  c.mscale_all_dim = d.mscale_all_dim, c.beta_fast = d.beta_fast;
  c.original_max_position_embeddings = d.original_max_position_embeddings;
}

// The tiny configs' MLA dims. "llama": query compression, YaRN (factor 4, mscale 0.9 / 0.7, an original context of
// 64 positions: the ramp's every band at dr = 8), value heads narrower than query / key heads (10 vs 20: values
// padded). "gpt2": no query compression, plain RoPE, value heads wider (16 vs 10: queries / keys padded).
inline MlaDims mla_tiny_dims(const std::string& style) {
  if (style == "llama")
    return {.q_lora_rank = 24, .kv_lora_rank = 16, .qk_head_dim = 12, .qk_pos_emb_head_dim = 8, .v_head_dim = 10,
            .rope_type = "yarn", .rotary_scaling_factor = 4.0f, .mscale = 0.9f, .mscale_all_dim = 0.7f,
            .beta_fast = 8.0f, .original_max_position_embeddings = 64};
  return {.q_lora_rank = 0, .kv_lora_rank = 12, .qk_head_dim = 6, .qk_pos_emb_head_dim = 4, .v_head_dim = 16,
          .rope_type = "rope"};
}

// MLA dims for the CUDA tests at DeepSeek's head dims (qk 128 + 64 = 192 on cuDNN, values 128 padded), with query
// compression and YaRN.
inline MlaDims mla_gpu_dims() {
  return {.q_lora_rank = 64, .kv_lora_rank = 48, .qk_head_dim = 128, .qk_pos_emb_head_dim = 64, .v_head_dim = 128,
          .rope_type = "yarn", .rotary_scaling_factor = 4.0f, .mscale_all_dim = 0.7f,
          .original_max_position_embeddings = 16};
}

// tiny_config with multi-latent attention of mla_tiny_dims(style) and latent norms (llama: RMSNorm; gpt2: LayerNorm
// with biases).
inline TransformerConfig mla_tiny_config(const std::string& style) {
  TransformerConfig c = tiny_config(style);
  enable_mla(c, mla_tiny_dims(style));
  return c;
}

// tiny_config widened to head dim 64 (the CUDA attention kernels' and cuDNN's), for the CUDA model tests.
inline TransformerConfig tiny_gpu_config(const std::string& style) {
  TransformerConfig c = tiny_config(style);
  c.hidden_size = 128;
  c.kv_channels = 64;
  c.num_attention_heads = style == "gpt2" ? 2 : 4;
  c.num_query_groups = 2;
  c.ffn_hidden_size = style == "gpt2" ? 512 : 256;
  c.seq_length = 48;
  c.max_position_embeddings = 64;
  c.vocab_size = 500;
  c.padded_vocab_size = 512;
  return c;
}

// A single-rank tensor-parallel context (size-1 local communicator).
inline tensor_parallel::TPContext single_tp() { return {comm::make_local_world(), false}; }

struct Batch {
  Tensor tokens, labels, loss_mask;  // [s, b]
};

inline Batch fixed_batch(int64_t s, int64_t b, int64_t vocab, uint64_t salt = 0) {
  Batch bt{Tensor::empty({s, b}, DType::I32), Tensor::empty({s, b}, DType::I32), Tensor::empty({s, b})};
  for (int64_t i = 0; i < s * b; ++i) {
    bt.tokens.data<int32_t>()[i] = static_cast<int32_t>((i * 37 + 11 + salt * 7) % vocab);
    bt.labels.data<int32_t>()[i] = static_cast<int32_t>((i * 53 + 5 + salt * 3) % vocab);
    bt.loss_mask.data<float>()[i] = (i % 7 == 3) ? 0.0f : 1.0f;  // some masked positions
  }
  return bt;
}

}  // namespace mcpp::testing
