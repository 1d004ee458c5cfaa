// The GPT layer specs (Megatron-Core models/gpt/gpt_layer_specs.py: get_gpt_layer_local_spec,
// get_gpt_decoder_block_spec): the ONE place that chooses which implementation builds each part of a transformer
// layer (transformer/spec.h's TransformerLayerSpec):
//   attention       "self_attention" (SelfAttention) | "mla" (MLASelfAttention, --multi-latent-attention)
//   core attention  "flash" | "unfused" (--attention-impl); under context parallelism p2p (--cp-comm-type p2p) the
//                   factory builds the ring form (ring_attention.h) instead, every head over this rank's rows
//   mlp             "mlp" (dense MLP) | "moe" (MoELayer) — per layer, by --moe-layer-freq
//   norms           "LayerNorm" | "RMSNorm" (--normalization), input_layernorm, pre_mlp_layernorm, final_layernorm
//   MTP depths      enorm, hnorm, final_layernorm (the decoder's norm) and the decoder's last layer spec
//                   (get_gpt_mtp_layer_spec, Megatron's get_gpt_mtp_block_spec)
//   linears         "fp8" (FP8 GEMMs, the config's recipe: --fp8-format, --fp8-recipe ...) | "local" (the model's
//                   dtype) — per layer: "local" without FP8 and, under --first-last-layers-bf16, for the first
//                   --num-layers-at-start-in-bf16 / last --num-layers-at-end-in-bf16 global layers
//                   (TransformerConfig::is_first_last_bf16_layer, Megatron's); the MTP depths take the decoder's last
//                   layer's. The modules build their
//                   tensor_parallel Column/RowParallelLinears with the spec's linear_fp8 (transformer/spec.h). Not
//                   chosen here (the model's dtype always): the output layer, the MTP eh_proj and output layer, MLA's
//                   down/up projections, the routed experts, the embeddings.
// Adding an attention variant: write its module (transformer/, with its Ctx and visit_ctx_tensors overload), add a
// factory below (the pattern of self_attention_factory in the .cpp) and select it in get_gpt_layer_local_spec — the
// layer, block and model do not change. The parts are public so that a caller (a test, an experiment) can assemble
// a spec by hand.
#pragma once
#include <string>
#include <vector>

#include "mcpp/transformer/multi_token_prediction.h"
#include "mcpp/transformer/spec.h"
#include "mcpp/transformer/transformer_config.h"

namespace mcpp {

// Core attentions by --attention-impl name; an unknown name -> mcpp::Error listing the registered ones. The factory
// builds the ring attention instead when the layer's TPContext runs context parallelism p2p.
CoreAttentionFactory core_attention_factory(const std::string& name);
std::vector<std::string> core_attention_names();

AttentionFactory self_attention_factory();
AttentionFactory mla_factory();
MlpFactory dense_mlp_factory();
MlpFactory moe_factory();
NormFactory norm_factory(const TransformerConfig& config);  // config.normalization, config.norm_epsilon

enum class LayerMlp { Dense, MoE };

// The layer's linears by name: "local" (the model's dtype) | "fp8" (config.fp8_options(); FP8 must be on); another
// name, or "fp8" without FP8 -> mcpp::Error.
void set_layer_linear(TransformerLayerSpec& spec, const std::string& linear, const TransformerConfig& config);

// Global decoder layer `layer`'s linears: "fp8" with FP8 on unless a first/last bf16 layer, else "local".
std::string gpt_layer_linear(const TransformerConfig& config, int64_t layer);

// One layer's spec from the config: attention by multi_latent_attention, core by attention_impl, norms by
// normalization; the MLP and the linears ("local" | "fp8", set_layer_linear) as asked.
TransformerLayerSpec get_gpt_layer_local_spec(const TransformerConfig& config, LayerMlp mlp, const std::string& linear);

// Megatron's get_gpt_decoder_block_spec: one layer spec per decoder layer (MoE where config.moe_layer_pattern()
// says; linears by gpt_layer_linear), the final norm.
TransformerBlockSpec get_gpt_decoder_block_spec(const TransformerConfig& config);

// Megatron's get_gpt_mtp_block_spec, one depth: the three norms from the config (as the decoder's) around
// `transformer_layer` (Megatron passes the decoder's last layer spec).
MtpLayerSpec get_gpt_mtp_layer_spec(const TransformerConfig& config, const TransformerLayerSpec& transformer_layer);

// What GPTModel is built from: the decoder's specs and the spec of every MTP depth.
struct GPTModelSpec {
  TransformerBlockSpec decoder;
  MtpLayerSpec mtp_layer;
};
GPTModelSpec get_gpt_model_spec(const TransformerConfig& config);

}  // namespace mcpp
