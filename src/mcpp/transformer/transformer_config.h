// TransformerConfig: the model's fields only (Megatron-Core's TransformerConfig; the model section of the config
// JSON / TOML). Fields declared once in fields() (transformer_config_fields.cpp; core/config_fields.h: flag, help,
// range, fingerprint rule, --use-checkpoint-args); validate() checks them (one-line mcpp::Error naming the field).
// Field names follow Megatron-LM's flags with '-' -> '_'. The other packages' configs and the combined Config
// (JSON, fingerprint, cross-config rules) are training/config.h's.
//
// Life cycle: defaults -> TOML / flags (or from_json) -> finalize() fills the 0-defaults -> validate().
// finalize() is idempotent, so a finalized config survives to_json -> from_json -> finalize unchanged.
// The padded vocabulary comes through set_vocab_size().
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mcpp/core/config_fields.h"
#include "mcpp/tensor_parallel/fp8_options.h"

namespace mcpp {

enum class Normalization { LayerNorm, RMSNorm };
enum class PositionEmbedding { LearnedAbsolute, Rope, None };

// Megatron's strings: "LayerNorm"|"RMSNorm"; "learned_absolute"|"rope"|"none". Parsing throws mcpp::Error naming
// `field`.
std::string to_string(Normalization v);
std::string to_string(PositionEmbedding v);
Normalization parse_normalization(const std::string& s, std::string_view field);
PositionEmbedding parse_position_embedding(const std::string& s, std::string_view field);

struct TransformerConfig {
  int64_t num_layers = 2;
  int64_t hidden_size = 64;
  int64_t num_attention_heads = 4;
  bool group_query_attention = false;  // --group-query-attention; alone it means num_query_groups = 1
  int64_t num_query_groups = 0;   // 0 -> = num_attention_heads (MHA). Unlike Megatron, a value given
                                  // without --group-query-attention is honored, not silently ignored.
  int64_t ffn_hidden_size = 0;    // 0 -> 4*h (GELU) or, with swiglu, Megatron's int(8h/3 / 64) * 64
  int64_t kv_channels = 0;        // head dim; 0 -> h / heads
  int64_t seq_length = 64;
  int64_t max_position_embeddings = 0;  // 0 -> seq_length
  Normalization normalization = Normalization::LayerNorm;
  float norm_epsilon = 1e-5f;
  bool swiglu = false;
  PositionEmbedding position_embedding_type = PositionEmbedding::LearnedAbsolute;
  float rotary_base = 10000.0f;
  float rotary_percent = 1.0f;
  // Megatron's --use-rope-scaling / --rope-scaling-factor (Llama 3.1's frequency scaling, HF rope_type "llama3";
  // transformer/rope.h): the rotary frequencies of wavelength above 8192 divided by the factor, those below 2048
  // kept, the band between interpolated (low / high frequency factors 1 / 4, Megatron's fixed values).
  bool use_rope_scaling = false;
  float rope_scaling_factor = 8.0f;
  // Megatron's --rotary-seq-len-interpolation-factor (linear position interpolation, HF rope_type "linear"): positions
  // enter RoPE divided by it. 0 = off (Megatron's None).
  float rotary_seq_len_interpolation_factor = 0.0f;
  bool untie_embeddings_and_output_weights = false;
  bool add_bias_linear = true;  // --disable-bias-linear sets false
  bool add_qkv_bias = false;    // --add-qkv-bias (effective only when add_bias_linear is false)
  // --qk-layernorm (Megatron's qk_layernorm): the model's normalization over each head's hn channels of q and k
  // (weights [hn] shared by the heads: self_attention.q_layernorm / k_layernorm), after the linear_qkv split and
  // before RoPE — Qwen3's, Gemma3's q_norm / k_norm.
  bool qk_layernorm = false;
  // Multi-latent attention (Megatron's --multi-latent-attention, MLASelfAttention; DeepSeek-V2/V3's MLA;
  // transformer/multi_latent_attention.h): queries from linear_q_proj, or with q_lora_rank > 0 through a q_lora_rank
  // wide bottleneck (linear_q_down_proj, linear_q_up_proj); keys and values from a kv_lora_rank wide latent
  // (linear_kv_down_proj, linear_kv_up_proj) — with --qk-layernorm the latents are normalized (q_layernorm,
  // kv_layernorm: Megatron's local spec; no other q / k norms then) —, per head qk_head_dim channels without positions
  // plus qk_pos_emb_head_dim rotary channels (the key's shared by all heads), values v_head_dim wide. Its RoPE:
  // rope_type "rope" or "yarn" ("" = yarn, Megatron's MLA default) over the qk_pos_emb_head_dim channels in
  // Megatron's MLA channel order; YaRN's fields below (Megatron's --rotary-scaling-factor, --mscale,
  // --mscale-all-dim, MLATransformerConfig's beta_fast / beta_slow / original_max_position_embeddings). The
  // softmax scale is mscale(rotary_scaling_factor, mscale_all_dim)^2 / sqrt(qk_head_dim + qk_pos_emb_head_dim) for
  // either rope type, as Megatron. Needs --position-embedding-type rope; num_query_groups, kv_channels,
  // rotary_percent and the standard attention's RoPE options do not apply.
  bool multi_latent_attention = false;
  int64_t q_lora_rank = 0;  // 0 = no query compression (Megatron's None)
  int64_t kv_lora_rank = 32;
  int64_t qk_head_dim = 128;
  int64_t qk_pos_emb_head_dim = 64;
  int64_t v_head_dim = 128;
  std::string rope_type;  // "" | "rope" | "yarn" (multi-latent attention only)
  float rotary_scaling_factor = 1.0f;
  float mscale = 1.0f;
  float mscale_all_dim = 0.0f;
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  int64_t original_max_position_embeddings = 4096;
  bool mla_yarn() const { return multi_latent_attention && rope_type != "rope"; }  // MLA with YaRN's tables
  float hidden_dropout = 0.1f;
  float attention_dropout = 0.1f;
  float init_method_std = 0.02f;
  int64_t padded_vocab_size = 0;  // set from the tokenizer and make_vocab_size_divisible_by
  int64_t vocab_size = 0;         // unpadded, from the tokenizer (or --vocab-size for NullTokenizer)
  int64_t make_vocab_size_divisible_by = 128;
  std::string attention_impl = "flash";  // ModuleSpec choice: "flash" | "unfused" (DotProductAttention)
  // Megatron's --deterministic-mode: bit-identical runs on the GPU too (training/process_settings.h). For
  // the CUDA flash attention: off = cuDNN's fastest backward (dQ accumulated with atomics), on = its
  // deterministic backward graph (or the mcpp kernels where cuDNN has no engine).
  bool deterministic_mode = false;
  bool apply_query_key_layer_scaling = false;
  // Activation recompute (Megatron's names; none of them changes the math):
  //   recompute_granularity "" (off) | "full" (whole layers, input kept) | "selective" (recompute_modules)
  //   recompute_method "" | "uniform" (groups of recompute_num_layers) | "block" (first
  //   recompute_num_layers layers of each pipeline stage / virtual chunk); full needs a method.
  //   recompute_modules (selective; Megatron's --recompute-modules): "core_attn" (the core attention: q, k, v
  //   kept), "mlp" (a dense layer's MLP: its input kept, fc1 / activation / fc2 re-run in backward), "moe" (a MoE
  //   layer: its input kept, the router, the dispatch with its all-to-alls, the experts and the shared expert
  //   re-run in backward; Megatron's moe_layer_recompute), "moe_act" (every routed expert's activation: fc1's output
  //   kept, the activation dropped after fc2 read it and re-run from it in backward), "shared_experts" (a MoE
  //   layer's shared expert: the layer's input kept, its MLP re-run in backward — under SP with its all-gather),
  //   "layernorm" (input_layernorm's and pre_mlp_layernorm's outputs: dropped where linear_qkv, the MLP or the MoE
  //   layer keep them — under SP their all-gathered copies —, re-run from the norms' kept inputs and statistics when
  //   the backward reaches the branch, re-gathered under SP; with "mlp" / "moe" the MLP's kept input goes too),
  //   "mla_up_proj" (multi-latent attention: the core attention's query / key / value dropped after its forward and
  //   rebuilt in backward from the up projections' kept inputs — their GEMMs and the RoPE re-run).
  std::string recompute_granularity;
  std::string recompute_method;
  int64_t recompute_num_layers = 0;  // full: layers per group (uniform) or per stage (block)
  std::vector<std::string> recompute_modules{"core_attn"};
  bool recomputes(const std::string& module) const {  // selective recompute of this module
    return recompute_granularity == "selective" &&
           std::find(recompute_modules.begin(), recompute_modules.end(), module) != recompute_modules.end();
  }
  // --calculate-per-token-loss: the loss is summed over tokens and divided once by the global number of
  // non-masked tokens (instead of a mean per microbatch averaged over microbatches).
  bool calculate_per_token_loss = false;
  // FP8 training (Megatron's --fp8-format / --fp8-recipe / --fp8-amax-history-len / --fp8-amax-compute-algo /
  // --fp8-margin, Transformer Engine's recipes; tensor_parallel/fp8_state.h): the dense layers' linears (attention
  // qkv / proj, MLP fc1 / fc2) run FP8 GEMMs; the output layer, norms, core attention and MoE experts stay in the
  // model's dtype. fp8_format "" (off) | "e4m3" | "hybrid" (e5m2 gradients); fp8_recipe "delayed" | "tensorwise" |
  // "blockwise" (DeepSeek-V3's 1x128 / 128x128 scales, per call: every GEMM dim a multiple of 128; "mxfp8" is refused).
  // On the CPU backend the casts are emulated (kernels/cpu/fp8.cpp, fp8_block.cpp).
  std::string fp8_format;
  std::string fp8_recipe = "delayed";
  int64_t fp8_amax_history_len = 1;             // Megatron's default (Transformer Engine's own: 1024)
  std::string fp8_amax_compute_algo = "most_recent";  // | "max"; Megatron's default
  int64_t fp8_margin = 0;
  // Megatron's --first-last-layers-bf16 / --num-layers-at-start-in-bf16 / --num-layers-at-end-in-bf16
  // (core/fp8_utils.py is_first_last_bf16_layer): with FP8 on, the first / last N global decoder layers keep their
  // linears in the model's dtype (their layer spec's "local" linears, models/gpt/gpt_layer_specs.h). No-ops without
  // FP8; start + end <= num_layers.
  bool first_last_layers_bf16 = false;
  int64_t num_layers_at_start_in_bf16 = 1;
  int64_t num_layers_at_end_in_bf16 = 1;
  bool fp8() const { return !fp8_format.empty(); }
  tensor_parallel::Fp8Options fp8_options() const;  // disabled when fp8_format is ""
  // Megatron's is_first_last_bf16_layer (core/fp8_utils.py): global decoder layer `layer` (0-based) is among the
  // first num_layers_at_start_in_bf16 or the last num_layers_at_end_in_bf16 under first_last_layers_bf16.
  bool is_first_last_bf16_layer(int64_t layer) const {
    if (!first_last_layers_bf16 || layer < 0) return false;
    return layer < num_layers_at_start_in_bf16 || layer >= num_layers - num_layers_at_end_in_bf16;
  }
  // Multi-token prediction (Megatron's --mtp-num-layers / --mtp-loss-scaling-factor; DeepSeek-V3's MTP;
  // transformer/multi_token_prediction.h): mtp_num_layers > 0 depths on the last pipeline stage, each predicting one
  // more token ahead; their losses' weight mtp_loss_scaling_factor / mtp_num_layers each. 0 = off (Megatron's None).
  // RoPE or no position embeddings only (Megatron's rule).
  int64_t mtp_num_layers = 0;
  float mtp_loss_scaling_factor = 0.1f;
  // The last pipeline stage uses the word embeddings too — as the tied output layer, or for the MTP depths'
  // embeddings (Megatron's setup_embeddings_and_output_layer): it holds a shared copy when it is not the first
  // stage, and finalize_model_grads sums the copies over the embedding group.
  bool last_stage_uses_word_embeddings() const { return !untie_embeddings_and_output_weights || mtp_num_layers > 0; }
  // The MTP depths are recomputed in backward (full recompute, uniform method; with block they are not, as Megatron).
  bool recomputes_mtp_depths() const { return recompute_granularity == "full" && recompute_method == "uniform"; }
  // Mixture of experts (Megatron's --num-experts, --moe-*; transformer/moe/moe_layer.h): with num_moe_experts > 0 the MLP of
  // the layers moe_layer_freq selects is a MoE layer of that many experts (0 = dense). TopKRouter: router logits
  // [n, E] = x W_r^T; each token goes to moe_router_topk experts — the top k logits, probabilities = softmax over
  // those k (with moe_router_pre_softmax: softmax over all E, then the top k of it) — and its output is the
  // probability-weighted sum of their MLPs (moe_ffn_hidden_size wide, 0 -> ffn_hidden_size). Dropless unless
  // moe_expert_capacity_factor is set (below). Load balancing "aux_loss" (Switch Transformer's, scaled by
  // moe_aux_loss_coeff), "seq_aux_loss" (DeepSeek's per-sequence form, same coefficient) or "none";
  // moe_z_loss_coeff > 0 adds ST-MoE's router z-loss. Dispatcher "alltoall" (Megatron's default is "allgather":
  // same math, the one implemented here is the all-to-all).
  int64_t num_moe_experts = 0;
  int64_t moe_router_topk = 2;
  int64_t moe_ffn_hidden_size = 0;
  bool moe_router_pre_softmax = false;
  std::string moe_router_load_balancing_type = "aux_loss";
  float moe_aux_loss_coeff = 0.0f;
  float moe_z_loss_coeff = 0.0f;
  std::string moe_token_dispatcher_type = "alltoall";
  // Megatron's --moe-router-topk-scaling-factor: > 0 multiplies the combine weights (the top-k probabilities) by it
  // (DeepSeek-V2's routed scaling); 0 = none (Megatron's None).
  float moe_router_topk_scaling_factor = 0.0f;
  // Megatron's --moe-layer-freq: which layers are MoE layers (the others keep a dense MLP). An integer N: layer i
  // (0-based, global) when i % N == 0; or a Python list expression of one 0 / 1 per layer, e.g. "([1]*3+[0])*2"
  // or "[1,0,1,0]" (lists, '+', '*' by an integer, parentheses). moe_layer_pattern() expands it.
  std::string moe_layer_freq = "1";
  // Megatron's --moe-shared-expert-intermediate-size: > 0 adds a shared expert to every MoE layer, a dense MLP of
  // that width (tensor parallel like a dense MLP; "<layer>.mlp.shared_experts.linear_fc1/2") run on every token,
  // its output added to the routed experts' weighted sum.
  int64_t moe_shared_expert_intermediate_size = 0;
  // Megatron's --moe-shared-expert-gate (Qwen-MoE's gated shared expert): the shared expert's output scaled per token
  // by sigmoid(x . w) ("<layer>.mlp.shared_experts.gate_weight" [1, h], replicated over TP).
  bool moe_shared_expert_gate = false;
  // Megatron's --moe-input-jitter-eps (Switch Transformer's jitter): eps > 0 multiplies the router's input by noise
  // uniform in [1 - eps, 1 + eps) per element in a training forward (ops::random_scale, drawn from the RNG stream of
  // the hidden dropout: model-parallel under sequence parallelism), its gradient by the same noise; the experts see
  // the clean input. 0 = off (Megatron's None). Megatron jitters evaluation forwards too; evaluation here does not.
  float moe_input_jitter_eps = 0.0f;
  // Megatron's --moe-router-force-load-balancing (for benchmarks): a training forward routes by standard-normal
  // random logits (ops::random_normal, same RNG stream) instead of the router's — its GEMM is skipped — and the
  // routing's logit gradient passes straight to the router (Megatron's RandomSTE). Evaluation routes by the real
  // logits (Megatron randomizes those too).
  bool moe_router_force_load_balancing = false;
  // Megatron's token dropping: --moe-expert-capacity-factor c > 0 caps each expert at ceil(n * k / E * c) of a
  // microbatch's n local tokens' routes (0 = dropless, Megatron's None); --moe-token-drop-policy "probs" keeps the
  // routes of the highest probabilities, "position" the first in token order; a dropped route adds nothing to its
  // token's output. --moe-pad-expert-input-to-capacity: every expert processes exactly its capacity of rows (the
  // unused ones zero; the same math, static shapes).
  double moe_expert_capacity_factor = 0.0;
  std::string moe_token_drop_policy = "probs";
  bool moe_pad_expert_input_to_capacity = false;
  // Megatron's --moe-grouped-gemm: the local experts' GEMMs as one grouped launch each (experts.h: GroupedMLP).
  bool moe_grouped_gemm = false;
  // Megatron's --moe-router-score-function: "softmax" (above) or "sigmoid" (DeepSeek-V3): scores s = sigmoid(logits),
  // the top k of s, probabilities = s over their sum when k > 1 (s itself when k = 1); the load-balancing loss
  // uses s normalized over all experts. No pre-softmax with it (the z-loss stays on the logits).
  std::string moe_router_score_function = "softmax";
  // Megatron's --moe-router-dtype: "fp32" computes the router's logits GEMM (and its backward) in float32 from the
  // bf16 input and weight upcast, instead of the model's dtype ("" = that); the routing math after it is fp32 anyway.
  // fp64 is Megatron's other choice, not implemented.
  std::string moe_router_dtype;
  // Megatron's --moe-per-layer-logging: each MoE layer's router losses too (the metrics' train records, "moe_layers":
  // per layer the losses over their coefficients, averaged over microbatches, iterations of the window and ranks).
  bool moe_per_layer_logging = false;
  // Megatron's --moe-router-num-groups / --moe-router-group-topk (group-limited routing, DeepSeek-V2/V3's
  // device-limited routing): the experts in num_groups groups of consecutive ones; each token picks the group_topk
  // groups whose k / group_topk largest scores sum highest, then its top k among their experts. 0 = off.
  int64_t moe_router_num_groups = 0;
  int64_t moe_router_group_topk = 0;
  // Megatron's --moe-router-enable-expert-bias (DeepSeek-V3's aux-loss-free load balancing; sigmoid only): a
  // per-expert bias b (each router's "expert_bias", a checkpointed buffer, not a parameter) added to the scores when
  // choosing experts (not to the probabilities); after every training step b += --moe-router-bias-update-rate *
  // sign(mean count - count of each expert), the counts of the step's routes summed over the ranks that hold the
  // router (TP x CP x DP).
  bool moe_router_enable_expert_bias = false;
  float moe_router_bias_update_rate = 1e-3f;

  // Derived (valid after finalize()).
  int64_t head_dim() const { return kv_channels; }
  bool qkv_bias() const { return add_bias_linear || add_qkv_bias; }  // Megatron: add_qkv_bias | add_bias_linear
  int64_t rotary_dim() const;  // int(kv_channels * rotary_percent), Megatron's rotary_dim
  // moe_layer_freq expanded to num_layers flags (all false without experts); throws mcpp::Error naming a malformed
  // expression or a pattern whose length is not num_layers. is_moe_layer(i): global layer i's flag.
  std::vector<bool> moe_layer_pattern() const;
  bool is_moe_layer(int64_t layer) const;
  int64_t num_moe_layers() const;
  // vocab_size = n; padded_vocab_size = n rounded up to make_vocab_size_divisible_by * tp (Megatron's
  // _vocab_size_with_padding).
  void set_vocab_size(int64_t n, int64_t tensor_model_parallel_size);
  void finalize();   // fills 0-defaults; call after parsing, before validate()
  static const config::FieldTable<TransformerConfig>& fields();
  void validate() const;
};

}  // namespace mcpp
