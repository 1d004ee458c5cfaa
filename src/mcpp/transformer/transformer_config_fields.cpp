// TransformerConfig's field table (core/config_fields.h): one row per member, in declaration order — its flag,
// help, float range, fingerprint rule and whether --use-checkpoint-args takes it from the checkpoint.
//
// The fingerprint (Config::math_fields) holds what changes the function a checkpoint computes: the
// architecture, vocabulary and norms; init, dropout, the attention implementation, seq_length and recompute do
// not. Entries added after checkpoints existed are absent at their defaults (fingerprint_when), so that those
// checkpoints keep their fingerprint: the rotary fields only with rope, MLA's only with it on, MoE's only with
// experts (and most of those only when set).
#include <algorithm>
#include <string>
#include <vector>

#include "mcpp/core/config_fields.h"
#include "mcpp/transformer/transformer_config.h"

namespace mcpp {

namespace {
using Self = TransformerConfig;
using config::Range;

bool is_rope(const Self& m) { return m.position_embedding_type == PositionEmbedding::Rope; }
bool is_mla(const Self& m) { return m.multi_latent_attention; }
bool is_mla_yarn(const Self& m) { return m.mla_yarn(); }
bool has_experts(const Self& m) { return m.num_moe_experts > 0; }
}  // namespace

const config::FieldTable<TransformerConfig>& TransformerConfig::fields() {
  static const config::FieldTable<Self> table{
      "model",
      config::Fingerprint::Undecided,
      {
          MCPP_FIELD(num_layers).flag("--num-layers").fingerprint().checkpoint_arg(),
          MCPP_FIELD(hidden_size).flag("--hidden-size").fingerprint().checkpoint_arg(),
          MCPP_FIELD(num_attention_heads).flag("--num-attention-heads").fingerprint().checkpoint_arg(),
          // num_query_groups (resolved by finalize) carries it
          MCPP_FIELD(group_query_attention)
              .store_true("--group-query-attention", "grouped-query attention (default 1 group)")
              .no_fingerprint()
              .checkpoint_arg(),
          MCPP_FIELD(num_query_groups).flag("--num-query-groups").fingerprint().checkpoint_arg(),
          MCPP_FIELD(ffn_hidden_size).flag("--ffn-hidden-size").fingerprint().checkpoint_arg(),
          MCPP_FIELD(kv_channels).flag("--kv-channels").fingerprint().checkpoint_arg(),
          MCPP_FIELD(seq_length).flag("--seq-length").no_fingerprint(),
          MCPP_FIELD(max_position_embeddings)
              .flag("--max-position-embeddings")
              .fingerprint_when(
                  [](const Self& m) { return m.position_embedding_type == PositionEmbedding::LearnedAbsolute; })
              .checkpoint_arg(),
          MCPP_ENUM_FIELD(normalization, to_string, parse_normalization)
              .flag("--normalization", "LayerNorm|RMSNorm")
              .fingerprint()
              .checkpoint_arg(),
          MCPP_FIELD(norm_epsilon).flag("--norm-epsilon").range(Range::positive()).fingerprint().checkpoint_arg(),
          MCPP_FIELD(swiglu).store_true("--swiglu").fingerprint().checkpoint_arg(),
          MCPP_ENUM_FIELD(position_embedding_type, to_string, parse_position_embedding)
              .flag("--position-embedding-type", "learned_absolute|rope|none")
              .fingerprint()
              .checkpoint_arg(),
          MCPP_FIELD(rotary_base)
              .flag("--rotary-base")
              .range(Range::positive())
              .fingerprint_when(is_rope)
              .checkpoint_arg(),
          MCPP_FIELD(rotary_percent)
              .flag("--rotary-percent")
              .range(Range::unit_left_open())
              .fingerprint_when(is_rope)
              .checkpoint_arg(),
          // rope_scaling_factor carries it
          MCPP_FIELD(use_rope_scaling)
              .store_true("--use-rope-scaling", "Llama 3.x's RoPE frequency scaling (HF rope_type llama3)")
              .no_fingerprint()
              .checkpoint_arg(),
          MCPP_FIELD(rope_scaling_factor)
              .flag("--rope-scaling-factor", "the RoPE scaling factor (--use-rope-scaling)")
              .fingerprint_when([](const Self& m) { return is_rope(m) && m.use_rope_scaling; })
              .checkpoint_arg(),
          MCPP_FIELD(rotary_seq_len_interpolation_factor)
              .flag("--rotary-seq-len-interpolation-factor",
                    "linear position interpolation: RoPE positions divided by this (HF rope_type linear)")
              .range(Range::non_negative())
              .fingerprint_when(
                  [](const Self& m) { return is_rope(m) && m.rotary_seq_len_interpolation_factor > 0.0f; })
              .checkpoint_arg(),
          MCPP_FIELD(untie_embeddings_and_output_weights)
              .store_true("--untie-embeddings-and-output-weights")
              .fingerprint()
              .checkpoint_arg(),
          MCPP_FIELD(add_bias_linear).store_false("--disable-bias-linear").fingerprint().checkpoint_arg(),
          // Megatron's add_qkv_bias | add_bias_linear, as "qkv_bias"
          MCPP_FIELD(add_qkv_bias)
              .store_true("--add-qkv-bias")
              .fingerprint_as("qkv_bias", [](const Self& m) { return nlohmann::json(m.qkv_bias()); })
              .checkpoint_arg(),
          MCPP_FIELD(qk_layernorm)
              .store_true("--qk-layernorm",
                          "normalize each head's query and key (before RoPE); with MLA its q / kv latents")
              .fingerprint_when([](const Self& m) { return m.qk_layernorm; })
              .checkpoint_arg(),
          MCPP_FIELD(multi_latent_attention)
              .store_true("--multi-latent-attention", "multi-latent attention (DeepSeek-V2/V3's MLA)")
              .fingerprint_when(is_mla)
              .checkpoint_arg(),
          MCPP_FIELD(q_lora_rank)
              .flag("--q-lora-rank", "MLA: the query latent's width (0 = no query compression)")
              .fingerprint_when(is_mla)
              .checkpoint_arg(),
          MCPP_FIELD(kv_lora_rank)
              .flag("--kv-lora-rank", "MLA: the key / value latent's width")
              .fingerprint_when(is_mla)
              .checkpoint_arg(),
          MCPP_FIELD(qk_head_dim)
              .flag("--qk-head-dim", "MLA: query / key channels per head without positions")
              .fingerprint_when(is_mla)
              .checkpoint_arg(),
          MCPP_FIELD(qk_pos_emb_head_dim)
              .flag("--qk-pos-emb-head-dim", "MLA: query / key rotary channels per head")
              .fingerprint_when(is_mla)
              .checkpoint_arg(),
          MCPP_FIELD(v_head_dim)
              .flag("--v-head-dim", "MLA: value channels per head")
              .fingerprint_when(is_mla)
              .checkpoint_arg(),
          MCPP_FIELD(rope_type)
              .flag("--rope-type", "MLA's RoPE: rope|yarn (default yarn)")
              .fingerprint_as(
                  "rope_type", [](const Self& m) { return nlohmann::json(m.mla_yarn() ? "yarn" : "rope"); }, is_mla)
              .checkpoint_arg(),
          // the softmax scale with either rope type
          MCPP_FIELD(rotary_scaling_factor)
              .flag("--rotary-scaling-factor", "MLA: YaRN's scaling factor (and softmax mscale)")
              .range(Range::positive())
              .fingerprint_when(is_mla)
              .checkpoint_arg(),
          MCPP_FIELD(mscale).flag("--mscale", "MLA: YaRN's mscale").fingerprint_when(is_mla_yarn).checkpoint_arg(),
          MCPP_FIELD(mscale_all_dim)
              .flag("--mscale-all-dim", "MLA: YaRN's mscale_all_dim")
              .fingerprint_when(is_mla)
              .checkpoint_arg(),
          MCPP_FIELD(beta_fast)
              .flag("--beta-fast", "MLA: YaRN's beta_fast")
              .fingerprint_when(is_mla_yarn)
              .checkpoint_arg(),
          MCPP_FIELD(beta_slow)
              .flag("--beta-slow", "MLA: YaRN's beta_slow")
              .fingerprint_when(is_mla_yarn)
              .checkpoint_arg(),
          MCPP_FIELD(original_max_position_embeddings)
              .flag("--original-max-position-embeddings", "MLA: YaRN's original context length")
              .fingerprint_when(is_mla_yarn)
              .checkpoint_arg(),
          MCPP_FIELD(hidden_dropout).flag("--hidden-dropout").range(Range::unit_open()).no_fingerprint(),
          MCPP_FIELD(attention_dropout).flag("--attention-dropout").range(Range::unit_open()).no_fingerprint(),
          MCPP_FIELD(init_method_std).flag("--init-method-std").range(Range::positive()).no_fingerprint(),
          // the vocabulary is the tokenizer's (a mismatch is the load's named fingerprint error)
          MCPP_FIELD(padded_vocab_size)
              .no_flag("set from the tokenizer: vocab_size padded to make_vocab_size_divisible_by * tp")
              .fingerprint(),
          MCPP_FIELD(vocab_size).flag("--vocab-size", "vocabulary size (NullTokenizer)").fingerprint(),
          // padded_vocab_size carries it
          MCPP_FIELD(make_vocab_size_divisible_by)
              .flag("--make-vocab-size-divisible-by")
              .no_fingerprint()
              .checkpoint_arg(),
          MCPP_FIELD(attention_impl).flag("--attention-impl", "flash|unfused").no_fingerprint(),
          MCPP_FIELD(deterministic_mode)
              .store_true("--deterministic-mode",
                          "bit-identical GPU runs (cuDNN's deterministic attention backward, GEMM autotuning off, "
                          "ordered embedding backward)")
              .no_fingerprint(),
          MCPP_FIELD(apply_query_key_layer_scaling).store_true("--apply-query-key-layer-scaling").no_fingerprint(),
          MCPP_FIELD(recompute_granularity).flag("--recompute-granularity", "full|selective").no_fingerprint(),
          MCPP_FIELD(recompute_method).flag("--recompute-method", "uniform|block").no_fingerprint(),
          MCPP_FIELD(recompute_num_layers).flag("--recompute-num-layers").no_fingerprint(),
          MCPP_FIELD(recompute_modules)
              .flag("--recompute-modules",
                    "core_attn|mlp|moe|moe_act|shared_experts|layernorm|mla_up_proj ... (selective)")
              .no_fingerprint(),
          MCPP_FIELD(calculate_per_token_loss).store_true("--calculate-per-token-loss").no_fingerprint(),
          // ---- FP8 GEMMs: the numerics of the linears, not the function a checkpoint computes
          MCPP_FIELD(fp8_format).flag("--fp8-format", "e4m3|hybrid: FP8 GEMMs in the dense linears (unset = off)").no_fingerprint(),
          MCPP_FIELD(fp8_recipe).flag("--fp8-recipe", "delayed|tensorwise|blockwise (scaling of the FP8 casts)").no_fingerprint(),
          MCPP_FIELD(fp8_amax_history_len).flag("--fp8-amax-history-len", "delayed scaling: amax history length").no_fingerprint(),
          MCPP_FIELD(fp8_amax_compute_algo).flag("--fp8-amax-compute-algo", "most_recent|max (delayed scaling)").no_fingerprint(),
          MCPP_FIELD(fp8_margin).flag("--fp8-margin", "scale = (fp8_max / amax) / 2^margin").no_fingerprint(),
          MCPP_FIELD(first_last_layers_bf16).store_true("--first-last-layers-bf16", "FP8: keep the first / last layers' linears in bf16").no_fingerprint(),
          MCPP_FIELD(num_layers_at_start_in_bf16).flag("--num-layers-at-start-in-bf16", "--first-last-layers-bf16: first layers in bf16").no_fingerprint(),
          MCPP_FIELD(num_layers_at_end_in_bf16).flag("--num-layers-at-end-in-bf16", "--first-last-layers-bf16: last layers in bf16").no_fingerprint(),
          // the depths' parameters (not their loss weight)
          MCPP_FIELD(mtp_num_layers)
              .flag(
                  "--mtp-num-layers",
                  "multi-token prediction: depths on the last pipeline stage, each predicting one more token (0 = off)")
              .fingerprint_when([](const Self& m) { return m.mtp_num_layers > 0; })
              .checkpoint_arg(),
          MCPP_FIELD(mtp_loss_scaling_factor)
              .flag("--mtp-loss-scaling-factor", "weight of the MTP losses (each depth's: this / --mtp-num-layers)")
              .range(Range::non_negative())
              .no_fingerprint(),
          // ---- mixture of experts: the routing and the experts' width change the function
          MCPP_FIELD(num_moe_experts)
              .flag("--num-experts", "mixture of experts: experts per MoE layer (0 = dense)")
              .fingerprint_when(has_experts)
              .checkpoint_arg(),
          MCPP_FIELD(moe_router_topk).flag("--moe-router-topk").fingerprint_when(has_experts).checkpoint_arg(),
          MCPP_FIELD(moe_ffn_hidden_size).flag("--moe-ffn-hidden-size").fingerprint_when(has_experts).checkpoint_arg(),
          MCPP_FIELD(moe_router_pre_softmax)
              .store_true("--moe-router-pre-softmax")
              .fingerprint_when(has_experts)
              .checkpoint_arg(),
          // only sinkhorn routes by another function (the others differ in the loss)
          MCPP_FIELD(moe_router_load_balancing_type)
              .flag("--moe-router-load-balancing-type", "aux_loss|seq_aux_loss|sinkhorn|none")
              .fingerprint_when(
                  [](const Self& m) { return has_experts(m) && m.moe_router_load_balancing_type == "sinkhorn"; })
              .checkpoint_arg_when(
                  [](const Self& saved) { return saved.moe_router_load_balancing_type == "sinkhorn"; }),
          MCPP_FIELD(moe_aux_loss_coeff).flag("--moe-aux-loss-coeff").range(Range::non_negative()).no_fingerprint(),
          MCPP_FIELD(moe_z_loss_coeff).flag("--moe-z-loss-coeff").range(Range::non_negative()).no_fingerprint(),
          MCPP_FIELD(moe_token_dispatcher_type).flag("--moe-token-dispatcher-type", "alltoall").no_fingerprint(),
          MCPP_FIELD(moe_router_topk_scaling_factor)
              .flag("--moe-router-topk-scaling-factor", "multiply the top-k combine weights by this factor (0 = none)")
              .range(Range::non_negative())
              .fingerprint_when([](const Self& m) { return has_experts(m) && m.moe_router_topk_scaling_factor > 0.0f; })
              .checkpoint_arg(),
          // which layers route (the expanded form), when not all of them
          MCPP_FIELD(moe_layer_freq)
              .flag("--moe-layer-freq",
                    "MoE layers: every N-th layer, or a per-layer 0/1 list expression such as \"([1]*3+[0])*2\"")
              .fingerprint_as(
                  "moe_layer_pattern",
                  [](const Self& m) {
                    std::string flags;
                    for (bool b : m.moe_layer_pattern()) flags += b ? '1' : '0';
                    return nlohmann::json(flags);
                  },
                  [](const Self& m) {
                    if (!has_experts(m)) return false;
                    const std::vector<bool> pattern = m.moe_layer_pattern();
                    return std::find(pattern.begin(), pattern.end(), false) != pattern.end();
                  })
              .checkpoint_arg(),
          MCPP_FIELD(moe_shared_expert_intermediate_size)
              .flag("--moe-shared-expert-intermediate-size",
                    "width of a shared expert (a dense MLP on every token) in each MoE layer (0 = none)")
              .fingerprint_when(
                  [](const Self& m) { return has_experts(m) && m.moe_shared_expert_intermediate_size > 0; })
              .checkpoint_arg(),
          MCPP_FIELD(moe_shared_expert_gate)
              .store_true("--moe-shared-expert-gate", "scale the shared expert's output by a per-token sigmoid gate")
              .fingerprint_when([](const Self& m) { return has_experts(m) && m.moe_shared_expert_gate; })
              .checkpoint_arg(),
          MCPP_FIELD(moe_input_jitter_eps)
              .flag("--moe-input-jitter-eps",
                    "multiply the router's input by uniform noise in [1 - eps, 1 + eps) when training (0 = off)")
              .range(Range::unit_open())
              .no_fingerprint(),
          MCPP_FIELD(moe_router_force_load_balancing)
              .store_true("--moe-router-force-load-balancing",
                          "route training tokens by random logits (balanced experts, for benchmarks)")
              .no_fingerprint(),
          // which routes are dropped (padding changes no value)
          MCPP_FIELD(moe_expert_capacity_factor)
              .flag(
                  "--moe-expert-capacity-factor",
                  "cap each expert at ceil(tokens * topk / experts * factor) routes, dropping the rest (0 = dropless)")
              .range(Range::non_negative())
              .fingerprint_when([](const Self& m) { return has_experts(m) && m.moe_expert_capacity_factor > 0.0; })
              .checkpoint_arg(),
          MCPP_FIELD(moe_token_drop_policy)
              .flag("--moe-token-drop-policy", "probs|position")
              .fingerprint_when([](const Self& m) { return has_experts(m) && m.moe_expert_capacity_factor > 0.0; })
              .checkpoint_arg(),
          MCPP_FIELD(moe_pad_expert_input_to_capacity)
              .store_true("--moe-pad-expert-input-to-capacity")
              .no_fingerprint()
              .checkpoint_arg(),
          MCPP_FIELD(moe_grouped_gemm)
              .store_true("--moe-grouped-gemm",
                          "the local experts' GEMMs as one grouped launch each (fc1 / fc2 forward, dgrad, wgrad)")
              .no_fingerprint()
              .checkpoint_arg(),
          MCPP_FIELD(moe_router_score_function)
              .flag("--moe-router-score-function", "softmax|sigmoid")
              .fingerprint_when(
                  [](const Self& m) { return has_experts(m) && m.moe_router_score_function != "softmax"; })
              .checkpoint_arg(),
          MCPP_FIELD(moe_router_dtype)
              .flag("--moe-router-dtype", "fp32 (the router's logits in float32)")
              .no_fingerprint(),
          MCPP_FIELD(moe_per_layer_logging).store_true("--moe-per-layer-logging").no_fingerprint(),
          MCPP_FIELD(moe_router_num_groups)
              .flag("--moe-router-num-groups", "group-limited routing: the experts in this many groups (0 = off)")
              .fingerprint_when([](const Self& m) { return has_experts(m) && m.moe_router_num_groups > 0; })
              .checkpoint_arg(),
          MCPP_FIELD(moe_router_group_topk)
              .flag("--moe-router-group-topk", "group-limited routing: each token's experts come from this many groups")
              .fingerprint_when([](const Self& m) { return has_experts(m) && m.moe_router_num_groups > 0; })
              .checkpoint_arg(),
          MCPP_FIELD(moe_router_enable_expert_bias)
              .store_true("--moe-router-enable-expert-bias",
                          "aux-loss-free load balancing: a per-expert routing bias updated after every step (sigmoid "
                          "router)")
              .fingerprint_when([](const Self& m) { return has_experts(m) && m.moe_router_enable_expert_bias; })
              .checkpoint_arg(),
          MCPP_FIELD(moe_router_bias_update_rate)
              .flag("--moe-router-bias-update-rate")
              .range(Range::non_negative())
              .no_fingerprint(),
      }};
  return table;
}

}  // namespace mcpp
