// Config: defaults, finalize (0 -> derived values), validate (one-line mcpp::Error naming the field). The JSON round
// trip and the math fingerprint: transformer_config_json.cpp.
// (The MoE layer pattern, --moe-layer-freq, is parsed in moe_layer_freq.cpp.)
#include "mcpp/transformer/transformer_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <span>
#include <utility>

#include "mcpp/core/error.h"
#include "mcpp/datasets/blended_dataset.h"

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
std::string to_string(LrDecayStyle v) {
  switch (v) {
    case LrDecayStyle::Constant: return "constant";
    case LrDecayStyle::Linear: return "linear";
    case LrDecayStyle::Cosine: return "cosine";
    case LrDecayStyle::InverseSquareRoot: return "inverse-square-root";
    case LrDecayStyle::WSD: return "WSD";
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
LrDecayStyle parse_lr_decay_style(const std::string& s, std::string_view field) {
  if (s == "constant") return LrDecayStyle::Constant;
  if (s == "linear") return LrDecayStyle::Linear;
  if (s == "cosine") return LrDecayStyle::Cosine;
  if (s == "inverse-square-root") return LrDecayStyle::InverseSquareRoot;
  if (s == "WSD") return LrDecayStyle::WSD;
  fail("{}: unknown value '{}' (expected constant|linear|cosine|inverse-square-root|WSD)", field, s);
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

namespace {
void require_positive(int64_t v, const char* field) {
  if (v <= 0) fail("{} must be positive, got {}", field, v);
}
void require_non_negative(int64_t v, const char* field) {
  if (v < 0) fail("{} must be >= 0, got {}", field, v);
}
void require_dropout(float p, const char* field) {
  if (!(p >= 0.0f && p < 1.0f)) fail("{} must be in [0, 1), got {}", field, p);
}
}  // namespace

void TransformerConfig::validate() const {
  require_positive(num_layers, "num_layers");
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
  if (!(norm_epsilon > 0.0f)) fail("norm_epsilon must be positive, got {}", norm_epsilon);
  if (!(rotary_percent > 0.0f && rotary_percent <= 1.0f))
    fail("rotary_percent must be in (0, 1], got {}", rotary_percent);
  if (!(rotary_base > 0.0f)) fail("rotary_base must be positive, got {}", rotary_base);
  if (position_embedding_type == PositionEmbedding::Rope && (rotary_dim() <= 0 || rotary_dim() % 2 != 0))
    fail("rotary_percent: rope needs an even rotary dim > 0, got int(kv_channels {} * rotary_percent {}) = {}",
         kv_channels, rotary_percent, rotary_dim());
  if (use_rope_scaling) {
    if (position_embedding_type != PositionEmbedding::Rope)
      fail("use_rope_scaling: RoPE scaling needs --position-embedding-type rope");
    if (!(rope_scaling_factor >= 1.0f) || !std::isfinite(rope_scaling_factor))
      fail("rope_scaling_factor must be a finite value >= 1, got {}", rope_scaling_factor);
  }
  if (!(rotary_seq_len_interpolation_factor >= 0.0f) || !std::isfinite(rotary_seq_len_interpolation_factor))
    fail("rotary_seq_len_interpolation_factor must be a finite value >= 0 (0 = off), got {}",
         rotary_seq_len_interpolation_factor);
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
    if (!(rotary_scaling_factor > 0.0f) || !std::isfinite(rotary_scaling_factor))
      fail("rotary_scaling_factor must be a finite positive value, got {}", rotary_scaling_factor);
    if (!std::isfinite(mscale) || !std::isfinite(mscale_all_dim))
      fail("mscale / mscale_all_dim must be finite, got {} / {}", mscale, mscale_all_dim);
    if (mla_yarn()) {
      require_positive(original_max_position_embeddings, "original_max_position_embeddings");
      if (!(beta_fast > 0.0f) || !(beta_slow > 0.0f) || !std::isfinite(beta_fast) || !std::isfinite(beta_slow))
        fail("beta_fast / beta_slow must be finite positive values, got {} / {}", beta_fast, beta_slow);
    }
  } else if (!rope_type.empty()) {
    fail("rope_type {}: applies to multi-latent attention (--multi-latent-attention); the standard attention's "
         "RoPE is --position-embedding-type rope", rope_type);
  }
  require_dropout(hidden_dropout, "hidden_dropout");
  require_dropout(attention_dropout, "attention_dropout");
  if (!(init_method_std > 0.0f)) fail("init_method_std must be positive, got {}", init_method_std);
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
    if (!(mtp_loss_scaling_factor >= 0.0f) || !std::isfinite(mtp_loss_scaling_factor))
      fail("mtp_loss_scaling_factor must be a finite value >= 0, got {}", mtp_loss_scaling_factor);
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
    if (!(moe_aux_loss_coeff >= 0.0f)) fail("moe_aux_loss_coeff must be >= 0, got {}", moe_aux_loss_coeff);
    if (!(moe_z_loss_coeff >= 0.0f)) fail("moe_z_loss_coeff must be >= 0, got {}", moe_z_loss_coeff);
    if (moe_token_dispatcher_type != "alltoall")
      fail("moe_token_dispatcher_type: '{}' is not implemented (expected alltoall: the same math as Megatron's "
           "allgather default)", moe_token_dispatcher_type);
    require_non_negative(moe_shared_expert_intermediate_size, "moe_shared_expert_intermediate_size");
    if (!(moe_router_topk_scaling_factor >= 0.0f) || !std::isfinite(moe_router_topk_scaling_factor))
      fail("moe_router_topk_scaling_factor must be >= 0 (0 = none), got {}", moe_router_topk_scaling_factor);
    if (!(moe_expert_capacity_factor >= 0.0) || !std::isfinite(moe_expert_capacity_factor))
      fail("moe_expert_capacity_factor must be >= 0 (0 = dropless), got {}", moe_expert_capacity_factor);
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
    if (!(moe_router_bias_update_rate >= 0.0f) || !std::isfinite(moe_router_bias_update_rate))
      fail("moe_router_bias_update_rate must be >= 0, got {}", moe_router_bias_update_rate);
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
    if (!(moe_input_jitter_eps >= 0.0f && moe_input_jitter_eps < 1.0f))
      fail("moe_input_jitter_eps must be in [0, 1) (0 = off), got {}", moe_input_jitter_eps);
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

// ---------------------------------------------------------------- other structs
void ParallelConfig::validate() const {
  require_positive(tensor_model_parallel_size, "tensor_model_parallel_size");
  require_positive(pipeline_model_parallel_size, "pipeline_model_parallel_size");
  require_positive(context_parallel_size, "context_parallel_size");
  if (cp_comm_type != "a2a" && cp_comm_type != "p2p")
    fail("cp_comm_type '{}': 'a2a' (all-to-all, DeepSpeed-Ulysses) and 'p2p' (ring attention) are implemented; "
         "Megatron's 'all_gather' / 'a2a+p2p' forms are not", cp_comm_type);
  require_non_negative(num_layers_per_virtual_pipeline_stage, "num_layers_per_virtual_pipeline_stage");
  require_non_negative(data_parallel_size, "data_parallel_size");
  require_positive(expert_model_parallel_size, "expert_model_parallel_size");
  require_non_negative(expert_tensor_parallel_size, "expert_tensor_parallel_size");
  require_non_negative(ddp_bucket_size, "ddp_bucket_size");
  if (!(distributed_timeout_minutes > 0))
    fail("distributed_timeout_minutes must be positive, got {}", distributed_timeout_minutes);
  if (overlap_param_gather && !use_distributed_optimizer)
    fail("overlap_param_gather needs use_distributed_optimizer (Megatron)");
  if (num_layers_per_virtual_pipeline_stage > 0 && pipeline_model_parallel_size <= 2)
    fail("num_layers_per_virtual_pipeline_stage needs pipeline_model_parallel_size > 2 (Megatron), got {}",
         pipeline_model_parallel_size);
}

void TrainingConfig::validate() const {
  require_positive(micro_batch_size, "micro_batch_size");
  require_non_negative(global_batch_size, "global_batch_size");
  if (global_batch_size % micro_batch_size != 0)
    fail("global_batch_size ({}) must be divisible by micro_batch_size ({})", global_batch_size, micro_batch_size);
  require_non_negative(train_samples, "train_samples");
  // sample-based: train_iters is derived (Config::apply_world_size overwrites it; the flags and recipes refuse both)
  if (train_samples == 0) require_positive(train_iters, "train_iters");
  if (!rampup_batch_size.empty()) {
    if (rampup_batch_size.size() != 3)
      fail("rampup_batch_size takes 3 values (start, increment, ramp-up samples); got {}", rampup_batch_size.size());
    if (rampup_batch_size[0] <= 0 || rampup_batch_size[1] <= 0 || rampup_batch_size[2] <= 0)
      fail("rampup_batch_size: start ({}), increment ({}) and ramp-up samples ({}) must be positive",
           rampup_batch_size[0], rampup_batch_size[1], rampup_batch_size[2]);
    if (train_samples == 0)
      fail("rampup_batch_size needs sample-based training (--train-samples; Megatron's rule)");
  }
  require_non_negative(seed, "seed");
  require_positive(log_interval, "log_interval");
  require_positive(eval_interval, "eval_interval");
  require_non_negative(eval_iters, "eval_iters");
  require_non_negative(save_interval, "save_interval");
  require_non_negative(exit_interval, "exit_interval");
  require_non_negative(keep_last_n_checkpoints, "keep_last_n_checkpoints");
  if (bf16 && fp16) fail("bf16 and fp16 are both set; choose one");
  if (device != "auto" && device != "cpu" && device != "cuda")
    fail("device: unknown value '{}' (expected auto|cpu|cuda)", device);
  if (cuda_graph_scope != "full_iteration")
    fail("cuda_graph_scope: '{}' is not implemented (per-layer graphs, Megatron's full/attn scopes); use "
         "full_iteration", cuda_graph_scope);
  require_positive(cuda_graph_warmup_steps, "cuda_graph_warmup_steps");
  if (enable_cuda_graph && device == "cpu") fail("enable_cuda_graph: CUDA graphs need --device cuda (device is cpu)");
  if (enable_cuda_graph && !timeline.empty())
    fail("enable_cuda_graph: --timeline times each schedule action on the host, which a replayed graph does "
         "not run; use one or the other");
}

OptimizerConfig::Lengths OptimizerConfig::lengths(bool sample_based, int64_t global_batch_size) const {
  const double unit = sample_based ? 1.0 : static_cast<double>(global_batch_size);
  const double decay = static_cast<double>(sample_based ? lr_decay_samples : lr_decay_iters) * unit;
  // Megatron: lr_warmup_fraction * lr_decay_steps, else lr_warmup_iters * global_batch_size (or lr_warmup_samples)
  const double warmup = lr_warmup_fraction > 0.0f
                            ? static_cast<double>(lr_warmup_fraction) * decay
                            : static_cast<double>(sample_based ? lr_warmup_samples : lr_warmup_iters) * unit;
  return {warmup, decay, static_cast<double>(sample_based ? lr_wsd_decay_samples : lr_wsd_decay_iters) * unit};
}

void OptimizerConfig::validate() const {
  if (optimizer != "adam") fail("optimizer: unknown value '{}' (only adam is implemented)", optimizer);
  if (!(lr >= 0.0f)) fail("lr must be >= 0, got {}", lr);
  if (!(min_lr >= 0.0f)) fail("min_lr must be >= 0, got {}", min_lr);
  if (lr < min_lr) fail("lr ({}) must be >= min_lr ({})", lr, min_lr);
  if (!(lr_warmup_init >= 0.0f && lr_warmup_init <= lr))
    fail("lr_warmup_init ({}) must be in [0, lr = {}]", lr_warmup_init, lr);
  require_non_negative(lr_warmup_iters, "lr_warmup_iters");
  require_non_negative(lr_warmup_samples, "lr_warmup_samples");
  require_non_negative(lr_decay_samples, "lr_decay_samples");
  require_non_negative(lr_wsd_decay_samples, "lr_wsd_decay_samples");
  if (!(lr_warmup_fraction >= 0.0f && lr_warmup_fraction <= 1.0f))
    fail("lr_warmup_fraction must be in [0, 1], got {}", lr_warmup_fraction);
  if (lr_warmup_fraction > 0.0f && lr_warmup_iters > 0)
    fail("lr_warmup_fraction ({}) and lr_warmup_iters ({}) are both set; give one", lr_warmup_fraction,
         lr_warmup_iters);
  if (lr_warmup_fraction > 0.0f && lr_warmup_samples > 0)
    fail("lr_warmup_fraction ({}) and lr_warmup_samples ({}) are both set; give one", lr_warmup_fraction,
         lr_warmup_samples);
  // the lengths themselves: Config::validate, which knows the unit (iterations or samples)
  if (lr_wsd_decay_style != "exponential" && lr_wsd_decay_style != "linear" && lr_wsd_decay_style != "cosine" &&
      lr_wsd_decay_style != "minus_sqrt")
    fail("lr_wsd_decay_style: unknown value '{}' (expected exponential|linear|cosine|minus_sqrt)",
         lr_wsd_decay_style);
  if (!(weight_decay >= 0.0f)) fail("weight_decay must be >= 0, got {}", weight_decay);
  if (!(adam_beta1 >= 0.0f && adam_beta1 < 1.0f)) fail("adam_beta1 must be in [0, 1), got {}", adam_beta1);
  if (!(adam_beta2 >= 0.0f && adam_beta2 < 1.0f)) fail("adam_beta2 must be in [0, 1), got {}", adam_beta2);
  if (!(adam_eps > 0.0f)) fail("adam_eps must be positive, got {}", adam_eps);
  if (!(clip_grad >= 0.0f)) fail("clip_grad must be >= 0 (0 disables), got {}", clip_grad);
}

std::array<double, 3> DataConfig::split_fractions() const {
  char sep = split.find(',') != std::string::npos ? ',' : '/';
  std::vector<double> parts;
  size_t start = 0;
  while (true) {
    size_t end = split.find(sep, start);
    std::string tok = split.substr(start, end == std::string::npos ? std::string::npos : end - start);
    char* stop = nullptr;
    double v = std::strtod(tok.c_str(), &stop);
    if (tok.empty() || stop != tok.c_str() + tok.size() || !std::isfinite(v) || v < 0.0)
      fail("split: malformed '{}' (expected up to 3 non-negative weights like 969,30,1)", split);
    parts.push_back(v);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (parts.size() > 3) fail("split: malformed '{}' (more than 3 weights)", split);
  double sum = 0.0;
  for (double v : parts) sum += v;
  if (!(sum > 0.0)) fail("split: weights in '{}' sum to 0", split);
  std::array<double, 3> out{0.0, 0.0, 0.0};
  for (size_t i = 0; i < parts.size(); ++i) out[i] = parts[i] / sum;
  return out;
}

void DataConfig::validate() const {
  (void)split_fractions();
  const std::pair<const char*, const std::vector<std::string>*> paths[] = {
      {"data_path", &data_path}, {"train_data_path", &train_data_path}, {"valid_data_path", &valid_data_path},
      {"test_data_path", &test_data_path}};
  for (const auto& [field, path] : paths) {
    for (const auto& p : *path)
      if (p.empty()) fail("{}: empty path", field);
    if (!path->empty()) parse_data_blend(*path, field);  // a prefix, or 'weight prefix' pairs (errors name the field)
  }
  if (!data_path.empty() && (!train_data_path.empty() || !valid_data_path.empty() || !test_data_path.empty()))
    fail("data_path and train_data_path / valid_data_path / test_data_path are both set; give one (Megatron: one "
         "blend split by --split, or one per split)");
  if (tokenizer_type != "GPT2BPETokenizer" && tokenizer_type != "NullTokenizer")
    fail("tokenizer_type: unknown value '{}' (expected GPT2BPETokenizer|NullTokenizer)", tokenizer_type);
}

// ---------------------------------------------------------------- Config
void Config::finalize() {
  model.finalize();
  if (training.train_samples > 0) {
    if (optimizer.lr_decay_samples == 0) optimizer.lr_decay_samples = training.train_samples;
  } else if (optimizer.lr_decay_iters == 0) {
    optimizer.lr_decay_iters = training.train_iters;
  }
  if (parallel.tensor_model_parallel_size == 1) parallel.sequence_parallel = parallel.tp_comm_overlap = false;
}

void Config::validate() const {
  model.validate();
  parallel.validate();
  training.validate();
  optimizer.validate();
  data.validate();
  validate_lr_schedule();
  const int64_t tp = parallel.tensor_model_parallel_size, pp = parallel.pipeline_model_parallel_size;
  const int64_t cp = parallel.context_parallel_size;
  if (model.num_attention_heads % tp != 0)
    fail("num_attention_heads ({}) must be divisible by tensor_model_parallel_size ({})", model.num_attention_heads, tp);
  if (model.num_query_groups % tp != 0)
    fail("num_query_groups ({}) must be divisible by tensor_model_parallel_size ({})", model.num_query_groups, tp);
  if (model.multi_latent_attention) {  // the down projections are column parallel, then gathered (Megatron's spec)
    if (model.q_lora_rank % tp != 0)
      fail("q_lora_rank ({}) must be divisible by tensor_model_parallel_size ({}): linear_q_down_proj is column "
           "parallel", model.q_lora_rank, tp);
    if ((model.kv_lora_rank + model.qk_pos_emb_head_dim) % tp != 0)
      fail("kv_lora_rank + qk_pos_emb_head_dim ({}) must be divisible by tensor_model_parallel_size ({}): "
           "linear_kv_down_proj is column parallel", model.kv_lora_rank + model.qk_pos_emb_head_dim, tp);
  }
  if (model.ffn_hidden_size % tp != 0)
    fail("ffn_hidden_size ({}) must be divisible by tensor_model_parallel_size ({})", model.ffn_hidden_size, tp);
  if (!parallel.custom_pipeline_layout() && model.num_layers % pp != 0)
    fail("num_layers ({}) must be divisible by pipeline_model_parallel_size ({})", model.num_layers, pp);
  if (!parallel.custom_pipeline_layout() && parallel.num_layers_per_virtual_pipeline_stage > 0 &&
      (model.num_layers / pp) % parallel.num_layers_per_virtual_pipeline_stage != 0)
    fail("num_layers_per_virtual_pipeline_stage ({}) must divide num_layers / pipeline_model_parallel_size ({})",
         parallel.num_layers_per_virtual_pipeline_stage, model.num_layers / pp);
  if (cp > 1 && model.seq_length % (2 * cp) != 0)
    fail("seq_length ({}) must be divisible by 2 * context_parallel_size ({})", model.seq_length, 2 * cp);
  const bool ring = cp > 1 && parallel.cp_ring();
  if (cp > 1 && !ring && model.num_query_groups % (tp * cp) != 0)  // all-to-all: each rank takes whole groups
    fail("num_query_groups ({}) must be divisible by tensor_model_parallel_size * context_parallel_size ({}) with "
         "context parallelism (all-to-all: each rank attends over whole query groups; --cp-comm-type p2p has no "
         "such rule)", model.num_query_groups, tp * cp);
  if (ring && model.attention_impl != "flash")
    fail("cp_comm_type p2p: the ring attention merges blockwise (flash) results; --attention-impl {} is not "
         "supported with it (use flash, or --cp-comm-type a2a)", model.attention_impl);
  if (parallel.tp_comm_overlap && !parallel.sequence_parallel)
    fail("tp_comm_overlap: the tensor-parallel communication overlap needs --sequence-parallel (Megatron)");
  if (parallel.sequence_parallel && model.seq_length % (tp * cp) != 0)
    fail("seq_length ({}) must be divisible by tensor_model_parallel_size * context_parallel_size ({}) with "
         "sequence_parallel", model.seq_length, tp * cp);
  if (model.num_moe_experts > 0) {  // what the MoE layers run with so far (transformer/moe/moe_layer.h)
    if (tp > 1 && !parallel.sequence_parallel)
      fail("num_moe_experts: MoE layers with tensor_model_parallel_size {} need --sequence-parallel (Megatron's "
           "rule: each TP rank routes its own tokens)", tp);
    const int64_t etp = parallel.expert_tp();
    if (model.moe_ffn_hidden_size % etp != 0)
      fail("moe_ffn_hidden_size ({}) must be divisible by expert_tensor_parallel_size ({}; the default is "
           "tensor_model_parallel_size): each expert's FFN is split over it", model.moe_ffn_hidden_size, etp);
    if (training.enable_cuda_graph && etp > 1)
      fail("enable_cuda_graph: not implemented with expert_tensor_parallel_size {} (the default is "
           "tensor_model_parallel_size); pass --expert-tensor-parallel-size 1", etp);
    const int64_t ep = parallel.expert_model_parallel_size;
    if (model.num_moe_experts % ep != 0)
      fail("num_moe_experts ({}) must be divisible by expert_model_parallel_size ({})", model.num_moe_experts, ep);
    if (model.moe_shared_expert_intermediate_size % tp != 0)
      fail("moe_shared_expert_intermediate_size ({}) must be divisible by tensor_model_parallel_size ({}): the "
           "shared expert is tensor parallel", model.moe_shared_expert_intermediate_size, tp);
    const bool padded = model.moe_expert_capacity_factor > 0.0 && model.moe_pad_expert_input_to_capacity;
    if (training.enable_cuda_graph && !padded)
      fail("enable_cuda_graph: a dropless MoE layer reads its experts' token counts on the host every layer (they "
           "size the dispatch buffer), which a captured step cannot do; set --moe-expert-capacity-factor and "
           "--moe-pad-expert-input-to-capacity (fixed buffers, as Megatron's CUDA graphs need) or drop one of them");
  }
  if (data.tokenizer_type == "NullTokenizer" && model.vocab_size <= 0)
    fail("vocab_size must be given (--vocab-size) with tokenizer_type NullTokenizer");
  if (training.enable_cuda_graph) {  // what the captured step cannot contain (yet)
    if (parallel.expert_model_parallel_size > 1)
      fail("enable_cuda_graph: implemented for data, tensor (+ sequence), pipeline (1F1B, interleaved) and context "
           "parallelism, not expert_model_parallel_size {}", parallel.expert_model_parallel_size);
    if (parallel.variable_seq_lengths)
      fail("enable_cuda_graph: --variable-seq-lengths exchanges every P2P tensor's shape through the host (and a "
           "graph replays fixed shapes); drop one of them");
  }
}

void Config::validate_for_training() const {
  validate();
  if (data.data_path.empty() && data.train_data_path.empty())
    fail("data_path: training needs --data-path (or --train-data-path)");
}

void Config::validate_lr_schedule() const {
  const OptimizerConfig& o = optimizer;
  const bool samples = training.train_samples > 0;
  // Megatron's rule: the schedule's lengths in the training's unit only
  using Field = std::pair<const char*, int64_t>;
  const Field iters[] = {{"lr_warmup_iters", o.lr_warmup_iters}, {"lr_decay_iters", o.lr_decay_iters},
                         {"lr_wsd_decay_iters", o.lr_wsd_decay_iters}};
  const Field by_samples[] = {{"lr_warmup_samples", o.lr_warmup_samples}, {"lr_decay_samples", o.lr_decay_samples},
                              {"lr_wsd_decay_samples", o.lr_wsd_decay_samples}};
  for (const auto& [name, value] : samples ? std::span<const Field>(iters) : std::span<const Field>(by_samples))
    if (value != 0)
      fail("{} ({}) is set with {}-based training; give the schedule in {} (--lr-*-{})", name, value,
           samples ? "sample" : "iteration", samples ? "samples" : "iterations", samples ? "samples" : "iters");
  const char* unit = samples ? "samples" : "iters";
  const int64_t decay = samples ? o.lr_decay_samples : o.lr_decay_iters;
  if (decay <= 0) fail("lr_decay_{} must be positive, got {}", unit, decay);
  const OptimizerConfig::Lengths len = o.lengths(samples, 1);  // in the training's unit (iterations or samples)
  if (len.warmup >= len.decay)
    fail("lr_warmup_{} ({}) must be smaller than lr_decay_{} ({})", unit, len.warmup, unit, decay);
  if (o.lr_decay_style == LrDecayStyle::WSD && (len.wsd <= 0.0 || len.wsd > len.decay))
    fail("lr_wsd_decay_{} ({}) must be in [1, lr_decay_{} = {}] with lr_decay_style WSD", unit, len.wsd, unit, decay);
}

void Config::apply_world_size(int64_t world_size) {
  const int64_t mp = parallel.tensor_model_parallel_size * parallel.pipeline_model_parallel_size *
                     parallel.context_parallel_size;
  if (world_size <= 0 || world_size % mp != 0)
    fail("world size ({}) must be divisible by tensor_model_parallel_size * pipeline_model_parallel_size * "
         "context_parallel_size ({})", world_size, mp);
  parallel.data_parallel_size = world_size / mp;
  if (training.global_batch_size == 0)
    training.global_batch_size = training.micro_batch_size * parallel.data_parallel_size;
  if (training.global_batch_size % (training.micro_batch_size * parallel.data_parallel_size) != 0)
    fail("global_batch_size ({}) must be divisible by micro_batch_size * data_parallel_size ({} * {})",
         training.global_batch_size, training.micro_batch_size, parallel.data_parallel_size);
  const std::vector<int64_t>& ramp = training.rampup_batch_size;
  if (!ramp.empty()) {  // Megatron's RampupBatchsizeNumMicroBatchesCalculator asserts, as errors
    const int64_t mbs_dp = training.micro_batch_size * parallel.data_parallel_size;
    if (ramp[0] >= training.global_batch_size)
      fail("rampup_batch_size: start ({}) must be smaller than global_batch_size ({})", ramp[0],
           training.global_batch_size);
    if ((training.global_batch_size - ramp[0]) % ramp[1] != 0)
      fail("rampup_batch_size: global_batch_size - start ({} - {}) must be a multiple of the increment ({})",
           training.global_batch_size, ramp[0], ramp[1]);
    if (ramp[0] % mbs_dp != 0 || ramp[1] % mbs_dp != 0)
      fail("rampup_batch_size: start ({}) and increment ({}) must be multiples of micro_batch_size * "
           "data_parallel_size ({} * {}): every batch of the ramp is whole microbatches on every DP rank", ramp[0],
           ramp[1], training.micro_batch_size, parallel.data_parallel_size);
    if (training.enable_cuda_graph)
      fail("rampup_batch_size: the CUDA graph (--enable-cuda-graph) captures one microbatch count; not with a "
           "batch-size ramp-up");
  }
  if (training.train_samples > 0) {  // Megatron's update_train_iters
    int64_t iterations = 0, consumed = 0;
    if (!ramp.empty())  // the ramp-up: batch by batch while consumed <= ramp-up samples
      for (; consumed <= ramp[2] && consumed <= training.train_samples; ++iterations)
        consumed += global_batch_size_at(consumed);
    if (training.train_samples > consumed)  // then whole global batches (a partial last one is dropped)
      iterations += (training.train_samples - consumed) / training.global_batch_size;
    training.train_iters = iterations;
    if (training.train_iters == 0)
      fail("train_samples ({}) is smaller than global_batch_size ({}): not one iteration", training.train_samples,
           training.global_batch_size);
  }
}

int64_t Config::global_batch_size_at(int64_t consumed) const {
  const std::vector<int64_t>& ramp = training.rampup_batch_size;
  if (ramp.empty() || consumed > ramp[2]) return training.global_batch_size;
  const auto increments = static_cast<double>((training.global_batch_size - ramp[0]) / ramp[1]);
  const double per_increment = static_cast<double>(ramp[2]) / increments;  // samples per increment
  const auto steps = static_cast<int64_t>(static_cast<double>(consumed) / per_increment);
  return std::min(ramp[0] + steps * ramp[1], training.global_batch_size);
}

int64_t Config::num_microbatches_at(int64_t consumed) const {
  num_microbatches();  // the same precondition (apply_world_size)
  return global_batch_size_at(consumed) / (training.micro_batch_size * parallel.data_parallel_size);
}

int64_t Config::num_microbatches() const {
  if (parallel.data_parallel_size <= 0 || training.global_batch_size <= 0)
    fail("num_microbatches: data_parallel_size is not known yet (call apply_world_size)");
  return training.global_batch_size / (training.micro_batch_size * parallel.data_parallel_size);
}

}  // namespace mcpp
