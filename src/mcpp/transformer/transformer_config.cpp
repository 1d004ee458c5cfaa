// TransformerConfig: enum strings, finalize (0 -> derived values), validate (one-line mcpp::Error naming the field);
// contract in transformer_config.h. The field table: transformer_config_fields.cpp; the MoE layer pattern
// (--moe-layer-freq): moe_layer_freq.cpp.
#include "mcpp/transformer/transformer_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <span>
#include <utility>

#include "mcpp/core/error.h"

namespace mcpp {

// ---------------------------------------------------------------- enum strings
std::string to_string(Normalization v) { return v == Normalization::LayerNorm ? "LayerNorm" : "RMSNorm"; }
std::string to_string(PositionEmbedding v) {
  switch (v) {
    case PositionEmbedding::LearnedAbsolute: return "learned_absolute";
    case PositionEmbedding::Rope: return "rope";
    case PositionEmbedding::None: return "none";
  }
  return "?";
}
Normalization parse_normalization(const std::string& s, std::string_view field) {
  if (s == "LayerNorm") return Normalization::LayerNorm;
  if (s == "RMSNorm") return Normalization::RMSNorm;
  fail("{}: unknown value '{}' (expected LayerNorm|RMSNorm)", field, s);
}
PositionEmbedding parse_position_embedding(const std::string& s, std::string_view field) {
  if (s == "learned_absolute") return PositionEmbedding::LearnedAbsolute;
  if (s == "rope") return PositionEmbedding::Rope;
  if (s == "none") return PositionEmbedding::None;
  fail("{}: unknown value '{}' (expected learned_absolute|rope|none)", field, s);
}

// ---------------------------------------------------------------- TransformerConfig
int64_t TransformerConfig::rotary_dim() const {
  return static_cast<int64_t>(static_cast<double>(kv_channels) * static_cast<double>(rotary_percent));
}

void TransformerConfig::set_vocab_size(int64_t n, int64_t tensor_model_parallel_size) {
  if (n <= 0) fail("vocab_size must be positive, got {}", n);
  if (make_vocab_size_divisible_by <= 0)
    fail("make_vocab_size_divisible_by must be positive, got {}", make_vocab_size_divisible_by);
  if (tensor_model_parallel_size <= 0)
    fail("tensor_model_parallel_size must be positive, got {}", tensor_model_parallel_size);
  int64_t multiple = make_vocab_size_divisible_by * tensor_model_parallel_size;
  vocab_size = n;
  padded_vocab_size = (n + multiple - 1) / multiple * multiple;
}

void TransformerConfig::finalize() {
  if (num_query_groups == 0) num_query_groups = group_query_attention ? 1 : num_attention_heads;
  if (ffn_hidden_size == 0) {
    // Megatron (training/arguments.py): int((4 * h * 2 / 3) / 64) * 64 with swiglu, else 4 * h.
    ffn_hidden_size = swiglu ? static_cast<int64_t>((4.0 * static_cast<double>(hidden_size) * 2.0 / 3.0) / 64.0) * 64
                             : 4 * hidden_size;
  }
  if (kv_channels == 0 && num_attention_heads > 0 && hidden_size % num_attention_heads == 0)
    kv_channels = hidden_size / num_attention_heads;
  if (max_position_embeddings == 0) max_position_embeddings = seq_length;
  if (num_moe_experts > 0 && moe_ffn_hidden_size == 0) moe_ffn_hidden_size = ffn_hidden_size;
}

using config::require_non_negative;
using config::require_positive;

tensor_parallel::Fp8Options TransformerConfig::fp8_options() const {
  if (!fp8()) return {};
  return {.enabled = true,
          .hybrid = fp8_format == "hybrid",
          .recipe = fp8_recipe == "tensorwise"  ? tensor_parallel::Fp8Recipe::Tensorwise
                    : fp8_recipe == "blockwise" ? tensor_parallel::Fp8Recipe::Blockwise
                                                : tensor_parallel::Fp8Recipe::Delayed,
          .amax_history_len = fp8_amax_history_len,
          .amax_most_recent = fp8_amax_compute_algo == "most_recent",
          .margin = static_cast<int>(fp8_margin)};
}

void TransformerConfig::validate() const {
  config::check_fields(fields(), *this);  // finite floats in their rows' ranges (norm_epsilon, dropout, ...)
  if (!fp8_format.empty() && fp8_format != "e4m3" && fp8_format != "hybrid")
    fail("fp8_format: unknown value '{}' (expected e4m3|hybrid)", fp8_format);
  if (fp8_recipe == "mxfp8")
    fail("fp8_recipe: mxfp8 scaling is not implemented (Blackwell's; use delayed, tensorwise or blockwise)");
  if (fp8_recipe != "delayed" && fp8_recipe != "tensorwise" && fp8_recipe != "blockwise")
    fail("fp8_recipe: unknown value '{}' (expected delayed|tensorwise|blockwise)", fp8_recipe);
  if (fp8_amax_compute_algo != "max" && fp8_amax_compute_algo != "most_recent")
    fail("fp8_amax_compute_algo: unknown value '{}' (expected max|most_recent)", fp8_amax_compute_algo);
  if (fp8_amax_history_len < 1 || fp8_amax_history_len > 8192)
    fail("fp8_amax_history_len must be in [1, 8192]; got {}", fp8_amax_history_len);
  if (fp8_margin < 0 || fp8_margin > 64) fail("fp8_margin must be in [0, 64]; got {}", fp8_margin);
  require_positive(num_layers, "num_layers");
  require_non_negative(num_layers_at_start_in_bf16, "num_layers_at_start_in_bf16");
  require_non_negative(num_layers_at_end_in_bf16, "num_layers_at_end_in_bf16");
  if (first_last_layers_bf16 && num_layers_at_start_in_bf16 + num_layers_at_end_in_bf16 > num_layers)
    fail("first_last_layers_bf16: num_layers_at_start_in_bf16 ({}) + num_layers_at_end_in_bf16 ({}) exceeds "
         "num_layers ({})",
         num_layers_at_start_in_bf16, num_layers_at_end_in_bf16, num_layers);
  require_positive(hidden_size, "hidden_size");
  require_positive(num_attention_heads, "num_attention_heads");
  require_positive(num_query_groups, "num_query_groups");
  require_positive(seq_length, "seq_length");
  require_positive(make_vocab_size_divisible_by, "make_vocab_size_divisible_by");
  require_non_negative(vocab_size, "vocab_size");
  require_non_negative(padded_vocab_size, "padded_vocab_size");
  if (kv_channels == 0 && hidden_size % num_attention_heads != 0)
    fail("hidden_size ({}) must be divisible by num_attention_heads ({}) unless kv_channels is given", hidden_size,
         num_attention_heads);
  require_positive(kv_channels, "kv_channels");
  if (num_attention_heads % num_query_groups != 0)
    fail("num_attention_heads ({}) must be divisible by num_query_groups ({})", num_attention_heads,
         num_query_groups);
  if (ffn_hidden_size <= 0)
    fail("ffn_hidden_size must be positive, got {}{}", ffn_hidden_size,
         swiglu ? " (the swiglu default int(8h/3 / 64) * 64 is 0 for hidden_size < 48: set ffn_hidden_size)" : "");
  require_positive(max_position_embeddings, "max_position_embeddings");
  if (position_embedding_type == PositionEmbedding::LearnedAbsolute && seq_length > max_position_embeddings)
    fail("seq_length ({}) exceeds max_position_embeddings ({}) with learned_absolute positions", seq_length,
         max_position_embeddings);
  if (position_embedding_type == PositionEmbedding::Rope && (rotary_dim() <= 0 || rotary_dim() % 2 != 0))
    fail("rotary_percent: rope needs an even rotary dim > 0, got int(kv_channels {} * rotary_percent {}) = {}",
         kv_channels, rotary_percent, rotary_dim());
  if (use_rope_scaling) {
    if (position_embedding_type != PositionEmbedding::Rope)
      fail("use_rope_scaling: RoPE scaling needs --position-embedding-type rope");
    if (!(rope_scaling_factor >= 1.0f)) fail("rope_scaling_factor must be a finite value >= 1, got {}", rope_scaling_factor);
  }
  if (rotary_seq_len_interpolation_factor > 0.0f && position_embedding_type != PositionEmbedding::Rope)
    fail("rotary_seq_len_interpolation_factor: position interpolation needs --position-embedding-type rope");
  if (!rope_type.empty() && rope_type != "rope" && rope_type != "yarn")
    fail("rope_type: unknown value '{}' (expected rope|yarn)", rope_type);
  if (multi_latent_attention) {  // Megatron's MLA rules, and what does not apply to it refused by name
    require_non_negative(q_lora_rank, "q_lora_rank");
    require_positive(kv_lora_rank, "kv_lora_rank");
    require_positive(qk_head_dim, "qk_head_dim");
    require_positive(v_head_dim, "v_head_dim");
    if (qk_pos_emb_head_dim <= 0 || qk_pos_emb_head_dim % 2 != 0)
      fail("qk_pos_emb_head_dim must be even and positive (its channels rotate in pairs), got {}",
           qk_pos_emb_head_dim);
    if (position_embedding_type != PositionEmbedding::Rope)
      fail("multi_latent_attention: MLA applies RoPE in its own qk_pos_emb_head_dim channels; it needs "
           "--position-embedding-type rope (got {})", to_string(position_embedding_type));
    if (num_query_groups != num_attention_heads)
      fail("multi_latent_attention: MLA has one key / value head per query head; num_query_groups ({}) / "
           "--group-query-attention do not apply", num_query_groups);
    if (add_qkv_bias) fail("multi_latent_attention: --add-qkv-bias does not apply (MLA's projections have no bias)");
    if (rotary_percent != 1.0f)
      fail("multi_latent_attention: rotary_percent must be 1 (every qk_pos_emb_head_dim channel rotates), got {}",
           rotary_percent);
    if (use_rope_scaling || rotary_seq_len_interpolation_factor > 0.0f)
      fail("multi_latent_attention: --use-rope-scaling / --rotary-seq-len-interpolation-factor are the standard "
           "attention's RoPE options; MLA scales its RoPE by --rope-type yarn and --rotary-scaling-factor");
    if (mla_yarn()) {
      require_positive(original_max_position_embeddings, "original_max_position_embeddings");
      if (!(beta_fast > 0.0f) || !(beta_slow > 0.0f))
        fail("beta_fast / beta_slow must be finite positive values, got {} / {}", beta_fast, beta_slow);
    }
  } else if (!rope_type.empty()) {
    fail("rope_type {}: applies to multi-latent attention (--multi-latent-attention); the standard attention's "
         "RoPE is --position-embedding-type rope", rope_type);
  }
  if (attention_impl != "flash" && attention_impl != "unfused")
    fail("attention_impl: unknown value '{}' (expected flash|unfused)", attention_impl);
  if (padded_vocab_size != 0 && padded_vocab_size < vocab_size)
    fail("padded_vocab_size ({}) is smaller than vocab_size ({})", padded_vocab_size, vocab_size);
  // Recompute (Megatron's TransformerConfig.__post_init__ rules).
  if (!recompute_granularity.empty() && recompute_granularity != "full" && recompute_granularity != "selective")
    fail("recompute_granularity: unknown value '{}' (expected full|selective)", recompute_granularity);
  if (!recompute_method.empty() && recompute_method != "uniform" && recompute_method != "block")
    fail("recompute_method: unknown value '{}' (expected uniform|block)", recompute_method);
  require_non_negative(recompute_num_layers, "recompute_num_layers");
  if (recompute_granularity == "full") {
    if (recompute_method.empty())
      fail("recompute_method must be uniform or block with recompute_granularity full");
    if (recompute_num_layers <= 0) fail("recompute_num_layers must be positive with recompute_granularity full");
    if (recompute_num_layers > num_layers)
      fail("recompute_num_layers ({}) exceeds num_layers ({})", recompute_num_layers, num_layers);
  } else if (recompute_granularity == "selective") {
    if (!recompute_method.empty() || recompute_num_layers != 0)
      fail("recompute_method and recompute_num_layers must not be set with recompute_granularity selective");
  } else if (!recompute_method.empty() || recompute_num_layers != 0) {
    fail("recompute_method / recompute_num_layers need recompute_granularity full");
  }
  for (const std::string& m : recompute_modules)
    if (m != "core_attn" && m != "mlp" && m != "moe" && m != "moe_act" && m != "shared_experts" && m != "layernorm" &&
        m != "mla_up_proj")
      fail("recompute_modules: '{}' is not a module (expected core_attn|mlp|moe|moe_act|shared_experts|layernorm|"
           "mla_up_proj)", m);
  if (recompute_modules != std::vector<std::string>{"core_attn"} && recompute_granularity != "selective")
    fail("recompute_modules ({} given) applies to --recompute-granularity selective", recompute_modules.size());
  for (const char* m : {"moe", "moe_act"})
    if (recomputes(m) && num_moe_experts == 0)
      fail("recompute_modules {}: the model has no MoE layers (--num-experts)", m);
  if (recomputes("mla_up_proj") && !multi_latent_attention)
    fail("recompute_modules mla_up_proj: the model has no multi-latent attention (--multi-latent-attention)");
  if (recomputes("shared_experts") && moe_shared_expert_intermediate_size == 0)
    fail("recompute_modules shared_experts: the MoE layers have no shared expert "
         "(--moe-shared-expert-intermediate-size)");
  // Multi-token prediction (Megatron's arguments.py / TransformerConfig rules).
  require_non_negative(mtp_num_layers, "mtp_num_layers");
  if (mtp_num_layers > 0) {
    if (position_embedding_type == PositionEmbedding::LearnedAbsolute)
      fail("mtp_num_layers: multi-token prediction is not supported with learned_absolute position embeddings "
           "(Megatron's rule: rope or none; --position-embedding-type rope)");
  }
  // Mixture of experts (Megatron's MoE arguments).
  require_non_negative(num_moe_experts, "num_moe_experts");
  if (num_moe_experts > 0) {
    if (moe_router_topk < 1 || moe_router_topk > num_moe_experts || moe_router_topk > 64)
      fail("moe_router_topk ({}) must be in [1, num_moe_experts = {}] and at most 64", moe_router_topk,
           num_moe_experts);
    require_positive(moe_ffn_hidden_size, "moe_ffn_hidden_size");
    if (moe_router_load_balancing_type != "aux_loss" && moe_router_load_balancing_type != "seq_aux_loss" &&
        moe_router_load_balancing_type != "sinkhorn" && moe_router_load_balancing_type != "none")
      fail("moe_router_load_balancing_type: '{}' is not aux_loss|seq_aux_loss|sinkhorn|none",
           moe_router_load_balancing_type);
    if (moe_token_dispatcher_type != "alltoall")
      fail("moe_token_dispatcher_type: '{}' is not implemented (expected alltoall: the same math as Megatron's "
           "allgather default)", moe_token_dispatcher_type);
    require_non_negative(moe_shared_expert_intermediate_size, "moe_shared_expert_intermediate_size");
    if (moe_token_drop_policy != "probs" && moe_token_drop_policy != "position")
      fail("moe_token_drop_policy: '{}' is not probs|position", moe_token_drop_policy);
    if (moe_pad_expert_input_to_capacity && moe_expert_capacity_factor == 0.0)
      fail("moe_pad_expert_input_to_capacity needs --moe-expert-capacity-factor (a capacity to pad to)");
    if (moe_router_score_function != "softmax" && moe_router_score_function != "sigmoid")
      fail("moe_router_score_function: '{}' is not softmax|sigmoid", moe_router_score_function);
    if (moe_router_score_function == "sigmoid" && moe_router_pre_softmax)
      fail("moe_router_pre_softmax applies to the softmax score function, not moe_router_score_function sigmoid");
    if (!moe_router_dtype.empty() && moe_router_dtype != "fp32")
      fail("moe_router_dtype: '{}' is not implemented (fp32, or unset for the model's dtype; Megatron's fp64 is not)",
           moe_router_dtype);
    if (moe_router_enable_expert_bias && moe_router_score_function != "sigmoid")
      fail("moe_router_enable_expert_bias needs moe_router_score_function sigmoid (Megatron's rule)");
    if ((moe_router_num_groups > 0) != (moe_router_group_topk > 0))
      fail("moe_router_num_groups ({}) and moe_router_group_topk ({}) go together (group-limited routing)",
           moe_router_num_groups, moe_router_group_topk);
    if (moe_router_num_groups != 0) {
      if (moe_router_num_groups < 0 || moe_router_num_groups > 64 || num_moe_experts % moe_router_num_groups != 0)
        fail("moe_router_num_groups ({}) must be in [1, 64] and divide num_moe_experts ({})", moe_router_num_groups,
             num_moe_experts);  // 64: ops::kMaxMoeRouterGroups
      if (moe_router_group_topk < 1 || moe_router_group_topk > moe_router_num_groups ||
          moe_router_group_topk > moe_router_topk)
        fail("moe_router_group_topk ({}) must be in [1, min(moe_router_num_groups = {}, moe_router_topk = {})]",
             moe_router_group_topk, moe_router_num_groups, moe_router_topk);
      if (moe_router_group_topk * (num_moe_experts / moe_router_num_groups) < moe_router_topk)
        fail("moe_router_group_topk ({}) groups of {} experts hold fewer than moe_router_topk = {} experts",
             moe_router_group_topk, num_moe_experts / moe_router_num_groups, moe_router_topk);
    }
    if (moe_shared_expert_gate && moe_shared_expert_intermediate_size == 0)
      fail("moe_shared_expert_gate gates the shared expert: set --moe-shared-expert-intermediate-size");
    if (moe_router_load_balancing_type == "sinkhorn") {  // Megatron's sinkhorn_load_balancing
      if (moe_aux_loss_coeff > 0.0f)
        fail("moe_router_load_balancing_type sinkhorn has no load-balancing loss: set --moe-aux-loss-coeff 0 "
             "(Megatron's rule)");
      if (num_moe_experts > 1024)  // ops::kMaxSinkhornExperts
        fail("moe_router_load_balancing_type sinkhorn: at most 1024 experts (num_moe_experts {})", num_moe_experts);
      std::string unused;  // what Megatron's sinkhorn routing would silently ignore
      const std::initializer_list<std::pair<bool, const char*>> flags = {
          {moe_expert_capacity_factor > 0.0, "--moe-expert-capacity-factor"},
          {moe_router_topk_scaling_factor > 0.0f, "--moe-router-topk-scaling-factor"},
          {moe_router_num_groups > 0, "--moe-router-num-groups"},
          {moe_router_enable_expert_bias, "--moe-router-enable-expert-bias"},
          {moe_router_score_function != "softmax", "--moe-router-score-function"},
          {moe_router_pre_softmax, "--moe-router-pre-softmax"}};
      for (const auto& [set, flag] : flags)
        if (set) unused += std::string(unused.empty() ? "" : ", ") + flag;
      if (!unused.empty())
        fail("moe_router_load_balancing_type sinkhorn routes by its own activation (sigmoid at top-1, the softmax "
             "above) without capacity, scaling, groups or expert bias; drop {}", unused);
    }
    if (num_moe_layers() == 0)
      fail("moe_layer_freq: '{}' selects no layer of {} as a MoE layer; with --num-experts {} at least one must be",
           moe_layer_freq, num_layers, num_moe_experts);
  } else {
    if (moe_layer_freq != "1")
      fail("moe_layer_freq ('{}') needs --num-experts: the model has no MoE layers", moe_layer_freq);
    if (moe_shared_expert_intermediate_size != 0)
      fail("moe_shared_expert_intermediate_size ({}) needs --num-experts: shared experts live in MoE layers",
           moe_shared_expert_intermediate_size);
    if (moe_shared_expert_gate) fail("moe_shared_expert_gate needs --num-experts and a shared expert");
    if (moe_expert_capacity_factor != 0.0 || moe_pad_expert_input_to_capacity)
      fail("moe_expert_capacity_factor / moe_pad_expert_input_to_capacity need --num-experts: the model has no "
           "experts to cap");
    if (moe_router_score_function != "softmax" || moe_router_num_groups != 0 || moe_router_group_topk != 0 ||
        moe_router_enable_expert_bias || !moe_router_dtype.empty() || moe_per_layer_logging ||
        moe_input_jitter_eps != 0.0f || moe_router_force_load_balancing)
      fail("moe_router_score_function / moe_router_num_groups / moe_router_group_topk / moe_router_enable_expert_bias "
           "/ moe_router_dtype / moe_per_layer_logging / moe_input_jitter_eps / moe_router_force_load_balancing need "
           "--num-experts: the model has no router");
  }
}

}  // namespace mcpp
