// Conversion between our GPT checkpoints and HuggingFace transformers' GPT-2 / Llama / Mixtral / Qwen2 / Qwen2-MoE /
// Qwen3 / Qwen3-MoE layouts (and DeepSeek-V2 / V3's: hf_deepseek.h, dispatched from export_hf / import_hf).
//
// Contract. Our parameter keys and layouts (Megatron-Core local spec, linear weights [out, in]; each format's mapping is
// its rule table in hf_rules.cpp, applied to the model's own parameter list — a parameter without a rule is an error):
//   embedding.word_embeddings.weight        [Vp, h]        (Vp = padded vocab)
//   embedding.position_embeddings.weight    [max_pos, h]   (learned_absolute only)
//   decoder.layers.{i}.input_layernorm.{weight,bias}                 [h] (bias with LayerNorm)
//   decoder.layers.{i}.self_attention.linear_qkv.weight  [(nq + 2 ng) d, h]  (+ .bias with biases)
//       rows per query group g: [q heads of g: nq/ng * d rows][k of g: d rows][v of g: d rows]
//   decoder.layers.{i}.self_attention.linear_proj.{weight [h, nq d], bias [h]}
//   decoder.layers.{i}.self_attention.{q,k}_layernorm.{weight,bias}  [d] (qk_layernorm; bias with LayerNorm)
//   decoder.layers.{i}.pre_mlp_layernorm.{weight,bias}               [h]
//   decoder.layers.{i}.mlp.linear_fc1.{weight [f or 2f, h], bias}    swiglu rows: [gate f; up f]
//   decoder.layers.{i}.mlp.linear_fc2.{weight [h, f], bias [h]}
//   decoder.final_layernorm.{weight,bias}                            [h]
//   output_layer.weight                     [Vp, h]        (untied only)
// MoE models (num_moe_experts E > 0; every layer a MoE layer) have instead of mlp.linear_fc1/2:
//   decoder.layers.{i}.mlp.router.weight                             [E, h]
//   decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc1.weight  [2F, h] = [gate F; up F]   (F = moe_ffn)
//   decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc2.weight  [h, F]
//   decoder.layers.{i}.mlp.shared_experts.linear_fc1.weight [2S, h], .linear_fc2.weight [h, S], .gate_weight [1, h]
//     (a shared expert of width S, gated)
// (the layers moe_layer_freq leaves dense keep mlp.linear_fc1/2).
// HF GPT-2 (GPT2LMHeadModel) uses Conv1D weights stored [in, out] (c_attn columns q|k|v), an unpadded
// vocab and a tied lm_head (not stored). HF Llama (LlamaForCausalLM) uses [out, in] q/k/v/o and
// gate/up/down projections; its rotate_half RoPE equals Megatron's non-interleaved RoPE, so no row
// permutation. HF Mixtral (MixtralForCausalLM) is Llama's attention with block_sparse_moe.gate [E, h] and experts
// {e}.w1 (gate) / w3 (up) [F, h], w2 [h, F]; its routing (softmax over all E, top-k, renormalized) equals ours
// without pre-softmax (the softmax over the k chosen logits), dropless. HF Qwen2-MoE (Qwen2MoeForCausalLM): Llama's
// layout with q/k/v biases; mlp.gate [E, h], mlp.experts.{e}.gate/up/down_proj, mlp.shared_expert.gate/up/down_proj
// and mlp.shared_expert_gate [1, h] (sigmoid-gated shared expert); norm_topk_prob false = our pre-softmax routing
// (the full softmax's top-k probabilities), true = ours without; mlp_only_layers = our dense layers. HF Qwen2
// (Qwen2ForCausalLM, Qwen2.5's too): Llama's layout with q/k/v biases, head_dim = hidden / heads. HF Qwen3
// (Qwen3ForCausalLM): Llama's layout with self_attn.q_norm / k_norm [d] (RMSNorm over each head before RoPE = our
// qk_layernorm), head_dim free of hidden / heads; HF Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3's attention with
// Qwen2-MoE's expert layout, no shared expert. Export writes <out>/config.json and
// <out>/model.safetensors (F32, "__metadata__": {"format": "pt"}); import reads model.safetensors or
// model.safetensors.index.json shards (F32, F16 or BF16) and returns a model-only checkpoint (iteration 0,
// meta["config"] = {"model": {...}} with Config::to_json's field names, vocab padded with zero rows to a multiple
// of 128; `mcpp train --finetune` loads it). A config that the target format cannot express is an mcpp::Error
// naming the field.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "mcpp/dist_checkpointing/checkpoint.h"

namespace mcpp::dist_checkpointing {

enum class HfFormat { Gpt2, Llama, Mixtral, Qwen2Moe, Qwen3, Qwen3Moe, Qwen2, DeepseekV2, DeepseekV3 };
// "hf-gpt2" | "hf-llama" | "hf-mixtral" | "hf-qwen2-moe" | "hf-qwen3" | "hf-qwen3-moe" | "hf-qwen2" |
// "hf-deepseek-v2" | "hf-deepseek-v3" (hf_deepseek.h: multi-latent attention, MoE, MTP)
HfFormat parse_hf_format(const std::string& s);
const char* hf_format_name(HfFormat f);

// The model numbers the conversion needs, read from meta["config"] ("model" section); zero defaults
// resolved as TransformerConfig::finalize does (groups = heads, d = h / heads, f = 4h without swiglu,
// max_pos = seq_length, vocab_size = padded_vocab_size).
struct ModelDims {
  int64_t num_layers = 0, hidden = 0, heads = 0, groups = 0, head_dim = 0, ffn = 0;
  int64_t padded_vocab = 0, vocab = 0, max_pos = 0;
  double norm_eps = 1e-5, rotary_base = 10000.0, rotary_percent = 1.0;
  double rope_scaling_factor = 0.0;  // > 0: Llama 3's RoPE scaling (use_rope_scaling; HF rope_type "llama3")
  double rope_interpolation_factor = 0.0;  // > 0: rotary_seq_len_interpolation_factor (HF rope_type "linear")
  std::string normalization = "LayerNorm";            // "LayerNorm" | "RMSNorm"
  std::string position_embedding = "learned_absolute";  // "learned_absolute" | "rope" | "none"
  bool swiglu = false, untied = false, bias_linear = true;
  bool qkv_bias = false;  // QKV bias even without add_bias_linear (add_qkv_bias); implied by bias_linear
  bool qk_norm = false;   // qk_layernorm: self_attention.q_layernorm / k_layernorm [head_dim] (+ bias: LayerNorm)
  // mixture of experts: num_moe_experts, moe_router_topk, moe_ffn_hidden_size (experts 0: dense), which layers are
  // MoE layers (moe_layer_freq expanded, one entry per layer — empty: every layer; the others keep a dense MLP of
  // width ffn), moe_router_pre_softmax, the shared expert's width (moe_shared_expert_intermediate_size) and gate
  int64_t experts = 0, topk = 0, moe_ffn = 0;
  std::vector<bool> moe_layers;
  bool moe_pre_softmax = false;
  int64_t shared_ffn = 0;
  bool shared_gate = false;
  bool is_moe_layer(int64_t i) const {
    return experts > 0 && (moe_layers.empty() || moe_layers.at(static_cast<size_t>(i)));
  }
};
ModelDims model_dims_from_config(const nlohmann::json& config, const std::string& where);
nlohmann::json config_from_model_dims(const ModelDims& d);  // {"model": {...}}

// Our parameter keys for a model, in registration order, with their shapes: the model's own list
// (models/gpt/gpt_model_tensors.h) for the config these dims write.
std::vector<std::pair<std::string, Shape>> model_param_shapes(const ModelDims& d);

void export_hf(const CheckpointReader& reader, HfFormat format, const std::string& out_dir);
CheckpointContents import_hf(const std::string& hf_dir, HfFormat format);

}  // namespace mcpp::dist_checkpointing
