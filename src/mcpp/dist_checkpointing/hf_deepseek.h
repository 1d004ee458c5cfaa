// Conversion between our DeepSeek-style checkpoints (multi-latent attention, mixture of experts with a shared expert,
// multi-token prediction) and Hugging Face transformers' DeepseekV3ForCausalLM ("hf-deepseek-v3", model_type
// deepseek_v3) / DeepseekV2ForCausalLM ("hf-deepseek-v2", model_type deepseek_v2).
//
// Contract. Our keys (Megatron-Core's MLA / MoE / MTP local spec; n heads, dn = qk_head_dim, dr = qk_pos_emb_head_dim,
// dv = v_head_dim, rq = q_lora_rank, rkv = kv_lora_rank) and the HF tensors each one is (rows concatenated; linear
// weights [out, in]; the mapping itself is hf_rules.cpp's DeepSeek table, applied to the model's own tensor list):
//   embedding.word_embeddings.weight [Vp, h]                  model.embed_tokens.weight [V, h] (+ zero rows to Vp)
//   decoder.layers.{i}.input_layernorm.weight                 model.layers.{i}.input_layernorm.weight
//     .self_attention.linear_q_down_proj.weight [rq, h]       .self_attn.q_a_proj.weight          (rq > 0)
//     .self_attention.q_layernorm.weight [rq]                 .self_attn.q_a_layernorm.weight     (rq > 0)
//     .self_attention.linear_q_up_proj.weight [n(dn+dr), rq]  .self_attn.q_b_proj.weight          (rq > 0)
//     .self_attention.linear_q_proj.weight [n(dn+dr), h]      .self_attn.q_proj.weight            (rq = 0: null in HF)
//     .self_attention.linear_kv_down_proj.weight [rkv+dr, h]  .self_attn.kv_a_proj_with_mqa.weight
//     .self_attention.kv_layernorm.weight [rkv]               .self_attn.kv_a_layernorm.weight
//     .self_attention.linear_kv_up_proj.weight [n(dn+dv), rkv] .self_attn.kv_b_proj.weight
//     .self_attention.linear_proj.weight [h, n dv]            .self_attn.o_proj.weight
//     .pre_mlp_layernorm.weight                               .post_attention_layernorm.weight
//     dense layers (i < first_k_dense_replace): .mlp.linear_fc1 [gate; up], .linear_fc2 = .mlp.{gate,up,down}_proj
//     MoE layers: .mlp.router.weight [E, h] = .mlp.gate.weight; .mlp.router.expert_bias [E] (a buffer) =
//     .mlp.gate.e_score_correction_bias (V3; zeros exported for a model without the bias);
//     .mlp.experts.local_experts.{e}.linear_fc1/2 = .mlp.experts.{e}.{gate,up,down}_proj (transformers 5's fused
//     .mlp.experts.gate_up_proj [E, 2F, h] / down_proj [E, h, F] read too); .mlp.shared_experts.linear_fc1/2 =
//     .mlp.shared_experts.{gate,up,down}_proj (width moe_intermediate_size x n_shared_experts)
//   decoder.final_layernorm.weight = model.norm.weight; output_layer.weight [Vp, h] = lm_head.weight (untied)
//   mtp.layers.{k}.{enorm,hnorm}.weight, .eh_proj.weight [h, 2h] (columns [enorm(e); hnorm(h)], DeepSeek's order),
//     .transformer_layer.* (a MoE layer as above), .final_layernorm.weight = model.layers.{L+k}.{enorm, hnorm,
//     eh_proj, <layer tensors>, shared_head.norm}; the depth's model.layers.{L+k}.embed_tokens.weight and
//     shared_head.head.weight are copies of the shared embedding / output layer (exported as copies; on import they
//     must equal them bit for bit — our depths share them).
// RoPE: our MLA rotates the dr channels as (x[2j], x[2j+1]) pairs with frequency j (Megatron's MLA order), which is
// HF DeepSeek-V3's rope_interleave = true and DeepSeek-V2's complex-pair rotation: no row permutation either way
// (rope_interleave false is refused). Routing: V3 = sigmoid scores, e_score_correction_bias for the choice, groups
// ranked by the sum of their top-2 biased scores (= ours when topk / topk_group = 2, or when no group is excluded),
// the top-k renormalized when k > 1 (norm_topk_prob), times routed_scaling_factor; V2 (transformers' DeepseekV2) =
// softmax over all experts, top-k unnormalized (our --moe-router-pre-softmax), groups ranked by their best score
// (topk_method group_limited_greedy: = ours when topk = topk_group), times routed_scaling_factor. YaRN: rope_scaling
// {type yarn, factor, original_max_position_embeddings, beta_fast, beta_slow, mscale, mscale_all_dim} =
// our rope_type yarn fields; transformers takes the factor as max_position_embeddings / original_max_position_
// embeddings, so export writes max_position_embeddings = factor x original. What the target cannot express (e.g.
// softmax routing to V3, a gated shared expert, moe_layer_freq other than first-k-dense, RMSNorm epsilon other than
// HF's fixed 1e-6 of the latent norms) is an mcpp::Error naming the field.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "mcpp/dist_checkpointing/checkpoint.h"
#include "mcpp/dist_checkpointing/hf_convert.h"
#include "mcpp/dist_checkpointing/safetensors.h"

namespace mcpp::dist_checkpointing {

struct DeepseekDims {
  // hidden, num_layers, heads, ffn (dense layers), vocab / padded_vocab, max_pos, norm_eps, rotary_base, untied,
  // experts, topk, moe_ffn, moe_layers (first-k-dense), moe_pre_softmax, shared_ffn
  ModelDims m;
  int64_t q_lora_rank = 0;  // 0: linear_q_proj (HF null)
  int64_t kv_lora_rank = 0, qk_head_dim = 0, qk_pos_emb_head_dim = 0, v_head_dim = 0;
  bool yarn = false;  // rope_type yarn (else plain rope)
  double rotary_scaling_factor = 1.0, mscale = 1.0, mscale_all_dim = 0.0, beta_fast = 32.0, beta_slow = 1.0;
  int64_t original_max_pos = 4096;
  bool sigmoid = false;                // moe_router_score_function
  int64_t num_groups = 0, group_topk = 0;
  double topk_scaling = 0.0;           // moe_router_topk_scaling_factor (0: none)
  bool expert_bias = false;            // moe_router_enable_expert_bias
  int64_t mtp = 0;                     // mtp_num_layers
  int64_t first_k_dense() const;       // the leading dense layers (moe_layers must be [0]*k + [1]*(L-k))
};

// From / to our checkpoint's meta.config ({"model": {...}}, Config::to_json's names).
DeepseekDims deepseek_dims_from_config(const nlohmann::json& config, const std::string& where);
nlohmann::json config_from_deepseek_dims(const DeepseekDims& d);
// Our tensors, from the model itself (gpt_model_tensors): parameters in registration order, each router's expert_bias
// buffer after its weight, with their shapes.
std::vector<std::pair<std::string, Shape>> deepseek_param_shapes(const DeepseekDims& d);

// HF config.json <-> dims. hf_config throws naming the first field `f` cannot express; dims_from_hf throws naming a
// config.json field mcpp cannot represent. mtp_present: whether the directory holds the MTP depths' tensors
// (transformers' save_pretrained drops them; then the import has none).
nlohmann::json deepseek_hf_config(const DeepseekDims& d, HfFormat f);
DeepseekDims deepseek_dims_from_hf(const nlohmann::json& c, const std::string& path, HfFormat f, bool mtp_present);

// The HF tensors that copy another (HF name, HF name it duplicates): the MTP depths' embedding and output head.
std::vector<std::pair<std::string, std::string>> deepseek_copies(const DeepseekDims& d);

void export_deepseek(const CheckpointReader& reader, HfFormat f, std::vector<SafetensorsItem>& items,
                     nlohmann::json& cfg);
CheckpointContents import_deepseek(const std::string& hf_dir, HfFormat f);

}  // namespace mcpp::dist_checkpointing
