// Model dims from the checkpoint config, and export to HF GPT-2 / Llama / Mixtral / Qwen2-MoE / Qwen3 / Qwen3-MoE: the
// formats' config.json here, the tensors through the model's own list and the format's rules (hf_rules.h); see
// hf_convert.h.
#include "mcpp/dist_checkpointing/hf_convert.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "mcpp/core/error.h"
#include "mcpp/dist_checkpointing/hf_deepseek.h"
#include "mcpp/dist_checkpointing/hf_rules.h"
#include "mcpp/dist_checkpointing/hf_tensor_ops.h"
#include "mcpp/transformer/transformer_config.h"

namespace fs = std::filesystem;

namespace mcpp::dist_checkpointing {
using namespace hf_detail;

namespace {

int64_t get_int(const nlohmann::json& m, const char* name, const std::string& where, int64_t dflt,
                bool required) {
  auto it = m.find(name);
  if (it == m.end()) {
    if (required) fail("{}: missing field model.{}", where, name);
    return dflt;
  }
  if (!it->is_number_integer() || it->get<int64_t>() < 0)
    fail("{}: field model.{} must be a non-negative integer, got {}", where, name, it->dump());
  return it->get<int64_t>();
}

template <typename T>
T get_val(const nlohmann::json& m, const char* name, const std::string& where, T dflt) {
  auto it = m.find(name);
  if (it == m.end()) return dflt;
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    fail("{}: field model.{} has the wrong type: {}", where, name, it->dump());
  }
}

void require(bool ok, const std::string& format, const char* field, const std::string& got,
             const char* want) {
  if (!ok) fail("{} export: model.{} is {} but {} needs {}", format, field, got, format, want);
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("cannot create {}", path);
  out << text;
  out.flush();
  if (!out) fail("cannot write {}", path);
}

// RoPE's scaling in transformers 4's rope_scaling (null without one) and 5's rope_parameters: Llama 3's ("llama3") or
// position interpolation ("linear"); HF holds one rope type, so both at once is an error.
nlohmann::json rope_scaling_json(const ModelDims& d) {
  if (d.rope_scaling_factor > 0.0 && d.rope_interpolation_factor > 0.0)
    fail("HF export: model.use_rope_scaling and model.rotary_seq_len_interpolation_factor are both set; an HF config "
         "holds one RoPE type (llama3 or linear)");
  if (d.rope_interpolation_factor > 0.0) return {{"rope_type", "linear"}, {"factor", d.rope_interpolation_factor}};
  if (d.rope_scaling_factor <= 0.0) return nullptr;
  return {{"rope_type", "llama3"}, {"factor", d.rope_scaling_factor}, {"low_freq_factor", 1.0},
          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
}
nlohmann::json rope_parameters_json(const ModelDims& d) {
  nlohmann::json p = rope_scaling_json(d);
  if (p.is_null()) p = {{"rope_type", "default"}};
  p["rope_theta"] = d.rotary_base;
  return p;
}

// GPT2LMHeadModel's config.json; what it cannot express is an error naming the field.
nlohmann::json gpt2_config(const ModelDims& d) {
  const std::string F = "hf-gpt2";
  require(d.normalization == "LayerNorm", F, "normalization", d.normalization, "LayerNorm");
  require(d.position_embedding == "learned_absolute", F, "position_embedding_type", d.position_embedding,
          "learned_absolute");
  require(!d.swiglu, F, "swiglu", "true", "false (GELU)");
  require(d.bias_linear, F, "add_bias_linear", "false", "true");
  require(!d.untied, F, "untie_embeddings_and_output_weights", "true", "false (tied)");
  require(d.groups == d.heads, F, "num_query_groups", std::to_string(d.groups), "num_attention_heads (MHA)");
  require(d.head_dim * d.heads == d.hidden, F, "kv_channels", std::to_string(d.head_dim),
          "hidden_size / num_attention_heads");
  require(!d.qk_norm, F, "qk_layernorm", "true", "false");
  const int64_t h = d.hidden;
  return {{"architectures", {"GPT2LMHeadModel"}},
         {"model_type", "gpt2"},
         {"n_embd", h},
         {"n_layer", d.num_layers},
         {"n_head", d.heads},
         {"n_inner", d.ffn},
         {"n_positions", d.max_pos},
         {"n_ctx", d.max_pos},
         {"vocab_size", d.vocab},
         {"layer_norm_epsilon", d.norm_eps},
         {"activation_function", "gelu_new"},  // tanh GELU, as our gelu kernel
         {"resid_pdrop", 0.0},
         {"embd_pdrop", 0.0},
         {"attn_pdrop", 0.0},
         {"scale_attn_weights", true},
         {"tie_word_embeddings", true},
         {"initializer_range", 0.02},
         {"torch_dtype", "float32"}};
}

// The MoE settings beyond the dims: what MixtralForCausalLM / Qwen2MoeForCausalLM / Qwen3MoeForCausalLM cannot express
// is an error naming the field (Mixtral: every layer MoE, no shared expert, no pre-softmax; the Qwens: either top-k
// normalization; Qwen3-MoE: no shared expert).
void require_moe_routing(const nlohmann::json& m, const ModelDims& d, HfFormat f) {
  const std::string F = hf_format_name(f);
  auto str = [&](const char* k, const char* dflt) { return m.value(k, std::string(dflt)); };
  auto num = [&](const char* k) { return m.contains(k) && m[k].is_number() ? m[k].get<double>() : 0.0; };
  auto flag = [&](const char* k) { return m.contains(k) && m[k].is_boolean() && m[k].get<bool>(); };
  if (f == HfFormat::Mixtral) {
    bool all_moe = true;
    for (int64_t i = 0; i < d.num_layers; ++i) all_moe = all_moe && d.is_moe_layer(i);
    require(all_moe, F, "moe_layer_freq", str("moe_layer_freq", "1"), "every layer MoE");
    require(d.shared_ffn == 0, F, "moe_shared_expert_intermediate_size", std::to_string(d.shared_ffn),
            "0 (no shared expert)");
    require(!d.moe_pre_softmax, F, "moe_router_pre_softmax", "true", "false (the softmax over the top-k logits)");
  }
  if (f == HfFormat::Qwen3Moe)
    require(d.shared_ffn == 0, F, "moe_shared_expert_intermediate_size", std::to_string(d.shared_ffn),
            "0 (no shared expert)");
  require(str("moe_router_score_function", "softmax") == "softmax", F, "moe_router_score_function",
          str("moe_router_score_function", "softmax"), "softmax");
  require(num("moe_router_topk_scaling_factor") == 0, F, "moe_router_topk_scaling_factor",
          std::to_string(num("moe_router_topk_scaling_factor")), "0 (none)");
  require(num("moe_router_num_groups") == 0, F, "moe_router_num_groups", std::to_string(num("moe_router_num_groups")),
          "0 (no group-limited routing)");
  require(!flag("moe_router_enable_expert_bias"), F, "moe_router_enable_expert_bias", "true", "false");
  require(num("moe_expert_capacity_factor") == 0, F, "moe_expert_capacity_factor",
          std::to_string(num("moe_expert_capacity_factor")), "0 (dropless)");
}

// Llama and its relatives: Mixtral (every layer a sparse block), Qwen2-MoE (q/k/v biases, gated shared expert,
// MoE or dense layers), Qwen3 (q/k norms) and Qwen3-MoE (q/k norms, Qwen2-MoE's experts without a shared one).
nlohmann::json llama_config(const ModelDims& d, HfFormat f) {
  const std::string F = hf_format_name(f);
  const bool qwen = f == HfFormat::Qwen2Moe || f == HfFormat::Qwen2;  // q/k/v biases
  const bool qwen3 = f == HfFormat::Qwen3 || f == HfFormat::Qwen3Moe;              // q/k norms
  require(d.normalization == "RMSNorm", F, "normalization", d.normalization, "RMSNorm");
  require(d.position_embedding == "rope", F, "position_embedding_type", d.position_embedding, "rope");
  require(d.rotary_percent == 1.0, F, "rotary_percent", std::to_string(d.rotary_percent), "1.0");
  require(d.swiglu, F, "swiglu", "false", "true");
  require(!d.bias_linear, F, "add_bias_linear", "true", "false");
  if (!qwen) require(!d.qkv_bias, F, "add_qkv_bias", "true", "false");  // Qwen2's q/k/v always have biases
  if (qwen3)
    require(d.qk_norm, F, "qk_layernorm", "false", "true (Qwen3's q_norm / k_norm)");
  else
    require(!d.qk_norm, F, "qk_layernorm", "true", "false (hf-qwen3 / hf-qwen3-moe write q/k norms)");
  if (qwen)
    require(d.head_dim * d.heads == d.hidden, F, "kv_channels", std::to_string(d.head_dim),
            "hidden_size / num_attention_heads");
  if (f == HfFormat::Qwen2Moe) {
    require(d.shared_ffn > 0 && d.shared_gate, F, "moe_shared_expert_gate",
            d.shared_ffn > 0 ? "false" : "unset (no shared expert)", "a gated shared expert");
  }
  std::vector<int64_t> dense_layers;  // Qwen-MoE's mlp_only_layers
  for (int64_t i = 0; i < d.num_layers; ++i)
    if (!d.is_moe_layer(i)) dense_layers.push_back(i);
  nlohmann::json cfg = {{"architectures", {"LlamaForCausalLM"}},
                        {"model_type", "llama"},
                        {"hidden_size", d.hidden},
                        {"intermediate_size", d.ffn},
                        {"num_attention_heads", d.heads},
                        {"num_key_value_heads", d.groups},
                        {"num_hidden_layers", d.num_layers},
                        {"head_dim", d.head_dim},
                        {"rms_norm_eps", d.norm_eps},
                        {"rope_theta", d.rotary_base},  // transformers 4's field; 5's rope_parameters below
                        {"rope_scaling", rope_scaling_json(d)},
                        {"rope_parameters", rope_parameters_json(d)},
                        {"max_position_embeddings", d.max_pos},
                        {"vocab_size", d.vocab},
                        {"tie_word_embeddings", !d.untied},
                        {"attention_bias", false},
                        {"mlp_bias", false},
                        {"attention_dropout", 0.0},
                        {"hidden_act", "silu"},
                        {"pretraining_tp", 1},
                        {"initializer_range", 0.02},
                        {"torch_dtype", "float32"}};
  if (f == HfFormat::Llama) return cfg;
  for (const char* k : {"mlp_bias", "pretraining_tp", "attention_bias"}) cfg.erase(k);
  if (qwen3) {  // full causal attention in every layer; head_dim as given
    cfg["attention_bias"] = false;
    cfg["use_sliding_window"] = false;
    cfg["sliding_window"] = nullptr;
    cfg["max_window_layers"] = d.num_layers;
    cfg["layer_types"] = std::vector<std::string>(static_cast<size_t>(d.num_layers), "full_attention");
  }
  if (f == HfFormat::Qwen3) {
    cfg["architectures"] = {"Qwen3ForCausalLM"};
    cfg["model_type"] = "qwen3";
    return cfg;
  }
  if (f == HfFormat::Qwen2) {  // q/k/v biases (zeros for a model without them), head_dim = hidden / heads
    cfg["architectures"] = {"Qwen2ForCausalLM"};
    cfg["model_type"] = "qwen2";
    cfg.erase("head_dim");
    cfg["use_sliding_window"] = false;
    cfg["sliding_window"] = nullptr;
    cfg["max_window_layers"] = d.num_layers;
    cfg["layer_types"] = std::vector<std::string>(static_cast<size_t>(d.num_layers), "full_attention");
    return cfg;
  }
  cfg["num_experts_per_tok"] = d.topk;
  cfg["output_router_logits"] = false;
  cfg["sliding_window"] = nullptr;
  if (f == HfFormat::Mixtral) {  // the experts' width is intermediate_size; no sliding window, no training jitter
    cfg["architectures"] = {"MixtralForCausalLM"};
    cfg["model_type"] = "mixtral";
    cfg["intermediate_size"] = d.moe_ffn;
    cfg["num_local_experts"] = d.experts;
    cfg["router_jitter_noise"] = 0.0;
    return cfg;
  }
  // Qwen2-MoE / Qwen3-MoE; intermediate_size: the dense layers' MLP
  cfg["num_experts"] = d.experts;
  cfg["moe_intermediate_size"] = d.moe_ffn;
  cfg["norm_topk_prob"] = !d.moe_pre_softmax;  // renormalized top-k = the softmax over the k logits
  cfg["decoder_sparse_step"] = 1;
  cfg["mlp_only_layers"] = dense_layers;
  cfg["use_sliding_window"] = false;
  cfg["max_window_layers"] = d.num_layers;
  if (f == HfFormat::Qwen3Moe) {
    cfg["architectures"] = {"Qwen3MoeForCausalLM"};
    cfg["model_type"] = "qwen3_moe";
    cfg["router_aux_loss_coef"] = 0.0;
    return cfg;
  }
  cfg["architectures"] = {"Qwen2MoeForCausalLM"};
  cfg["model_type"] = "qwen2_moe";
  cfg.erase("head_dim");  // hidden / heads
  cfg["shared_expert_intermediate_size"] = d.shared_ffn;
  return cfg;
}

}  // namespace

HfFormat parse_hf_format(const std::string& s) {
  if (s == "hf-gpt2") return HfFormat::Gpt2;
  if (s == "hf-llama") return HfFormat::Llama;
  if (s == "hf-mixtral") return HfFormat::Mixtral;
  if (s == "hf-qwen2-moe") return HfFormat::Qwen2Moe;
  if (s == "hf-qwen3") return HfFormat::Qwen3;
  if (s == "hf-qwen3-moe") return HfFormat::Qwen3Moe;
  if (s == "hf-qwen2") return HfFormat::Qwen2;
  if (s == "hf-deepseek-v2") return HfFormat::DeepseekV2;
  if (s == "hf-deepseek-v3") return HfFormat::DeepseekV3;
  fail("--format: unknown value '{}' (expected hf-gpt2|hf-llama|hf-mixtral|hf-qwen2|hf-qwen2-moe|hf-qwen3|"
       "hf-qwen3-moe|hf-deepseek-v2|hf-deepseek-v3)", s);
}

const char* hf_format_name(HfFormat f) {
  switch (f) {
    case HfFormat::Gpt2: return "hf-gpt2";
    case HfFormat::Llama: return "hf-llama";
    case HfFormat::Mixtral: return "hf-mixtral";
    case HfFormat::Qwen2Moe: return "hf-qwen2-moe";
    case HfFormat::Qwen3: return "hf-qwen3";
    case HfFormat::Qwen3Moe: return "hf-qwen3-moe";
    case HfFormat::Qwen2: return "hf-qwen2";
    case HfFormat::DeepseekV2: return "hf-deepseek-v2";
    case HfFormat::DeepseekV3: return "hf-deepseek-v3";
  }
  return "?";
}

ModelDims model_dims_from_config(const nlohmann::json& config, const std::string& where) {
  if (!config.is_object() || !config.contains("model") || !config["model"].is_object())
    fail("{}: meta.config.model is missing (not a model checkpoint?)", where);
  const nlohmann::json& m = config["model"];
  ModelDims d;
  d.num_layers = get_int(m, "num_layers", where, 0, true);
  d.hidden = get_int(m, "hidden_size", where, 0, true);
  d.heads = get_int(m, "num_attention_heads", where, 0, true);
  if (d.heads == 0 || d.hidden == 0) fail("{}: model.hidden_size and model.num_attention_heads must be > 0", where);
  d.groups = get_int(m, "num_query_groups", where, 0, false);
  if (d.groups == 0) d.groups = d.heads;
  d.head_dim = get_int(m, "kv_channels", where, 0, false);
  if (d.head_dim == 0) d.head_dim = d.hidden / d.heads;
  d.swiglu = get_val<bool>(m, "swiglu", where, false);
  d.ffn = get_int(m, "ffn_hidden_size", where, 0, false);
  if (d.ffn == 0 && d.swiglu) fail("{}: model.ffn_hidden_size is 0 with swiglu (config not finalized)", where);
  if (d.ffn == 0) d.ffn = 4 * d.hidden;
  d.padded_vocab = get_int(m, "padded_vocab_size", where, 0, true);
  d.vocab = get_int(m, "vocab_size", where, 0, false);
  if (d.vocab == 0) d.vocab = d.padded_vocab;
  if (d.vocab > d.padded_vocab)
    fail("{}: model.vocab_size {} exceeds model.padded_vocab_size {}", where, d.vocab, d.padded_vocab);
  d.max_pos = get_int(m, "max_position_embeddings", where, 0, false);
  if (d.max_pos == 0) d.max_pos = get_int(m, "seq_length", where, 0, false);
  d.norm_eps = get_val<double>(m, "norm_epsilon", where, 1e-5);
  d.rotary_base = get_val<double>(m, "rotary_base", where, 10000.0);
  if (get_val<bool>(m, "use_rope_scaling", where, false))
    d.rope_scaling_factor = get_val<double>(m, "rope_scaling_factor", where, 8.0);
  d.rope_interpolation_factor = get_val<double>(m, "rotary_seq_len_interpolation_factor", where, 0.0);
  d.rotary_percent = get_val<double>(m, "rotary_percent", where, 1.0);
  d.normalization = get_val<std::string>(m, "normalization", where, "LayerNorm");
  if (d.normalization != "LayerNorm" && d.normalization != "RMSNorm")
    fail("{}: model.normalization '{}' (expected LayerNorm|RMSNorm)", where, d.normalization);
  d.position_embedding = get_val<std::string>(m, "position_embedding_type", where, "learned_absolute");
  d.untied = get_val<bool>(m, "untie_embeddings_and_output_weights", where, false);
  d.bias_linear = get_val<bool>(m, "add_bias_linear", where, true);
  d.qkv_bias = d.bias_linear || get_val<bool>(m, "add_qkv_bias", where, false);
  d.qk_norm = get_val<bool>(m, "qk_layernorm", where, false);
  if (d.heads % d.groups != 0)
    fail("{}: model.num_attention_heads {} is not a multiple of model.num_query_groups {}", where, d.heads,
         d.groups);
  d.experts = get_int(m, "num_moe_experts", where, 0, false);
  if (d.experts > 0) {
    d.topk = get_int(m, "moe_router_topk", where, 2, false);
    d.moe_ffn = get_int(m, "moe_ffn_hidden_size", where, 0, false);
    if (d.moe_ffn == 0) d.moe_ffn = d.ffn;
    if (d.topk < 1 || d.topk > d.experts)
      fail("{}: model.moe_router_topk {} outside [1, num_moe_experts = {}]", where, d.topk, d.experts);
    TransformerConfig pattern;  // moe_layer_freq expanded as the trainer does
    pattern.num_layers = d.num_layers;
    pattern.num_moe_experts = d.experts;
    pattern.moe_layer_freq = get_val<std::string>(m, "moe_layer_freq", where, "1");
    d.moe_layers = pattern.moe_layer_pattern();
    d.moe_pre_softmax = get_val<bool>(m, "moe_router_pre_softmax", where, false);
    d.shared_ffn = get_int(m, "moe_shared_expert_intermediate_size", where, 0, false);
    d.shared_gate = get_val<bool>(m, "moe_shared_expert_gate", where, false);
  }
  return d;
}

nlohmann::json config_from_model_dims(const ModelDims& d) {
  nlohmann::json m = {{"num_layers", d.num_layers},
                      {"hidden_size", d.hidden},
                      {"num_attention_heads", d.heads},
                      {"group_query_attention", d.groups != d.heads},
                      {"num_query_groups", d.groups},
                      {"ffn_hidden_size", d.ffn},
                      {"kv_channels", d.head_dim},
                      {"seq_length", d.max_pos},
                      {"max_position_embeddings", d.max_pos},
                      {"normalization", d.normalization},
                      {"norm_epsilon", d.norm_eps},
                      {"swiglu", d.swiglu},
                      {"position_embedding_type", d.position_embedding},
                      {"rotary_base", d.rotary_base},
                      {"rotary_percent", d.rotary_percent},
                      {"use_rope_scaling", d.rope_scaling_factor > 0.0},
                      {"rope_scaling_factor", d.rope_scaling_factor > 0.0 ? d.rope_scaling_factor : 8.0},
                      {"rotary_seq_len_interpolation_factor", d.rope_interpolation_factor},
                      {"untie_embeddings_and_output_weights", d.untied},
                      {"add_bias_linear", d.bias_linear},
                      {"add_qkv_bias", d.qkv_bias && !d.bias_linear},
                      {"padded_vocab_size", d.padded_vocab},
                      {"vocab_size", d.vocab},
                      {"make_vocab_size_divisible_by", 128}};
  if (d.qk_norm) m["qk_layernorm"] = true;
  if (d.experts > 0) {
    m["num_moe_experts"] = d.experts;
    m["moe_router_topk"] = d.topk;
    m["moe_ffn_hidden_size"] = d.moe_ffn;
    std::string freq = "1";  // every layer, else the per-layer list
    if (std::find(d.moe_layers.begin(), d.moe_layers.end(), false) != d.moe_layers.end()) {
      freq = "[";
      for (size_t i = 0; i < d.moe_layers.size(); ++i)
        freq += std::string(i ? "," : "") + (d.moe_layers[i] ? "1" : "0");
      freq += "]";
    }
    m["moe_layer_freq"] = freq;
    m["moe_router_pre_softmax"] = d.moe_pre_softmax;
    m["moe_shared_expert_intermediate_size"] = d.shared_ffn;
    m["moe_shared_expert_gate"] = d.shared_gate;
  }
  return {{"model", m}};
}

std::vector<std::pair<std::string, Shape>> model_param_shapes(const ModelDims& d) {
  return model_tensors_from_config(config_from_model_dims(d));
}

namespace {

// Qwen2's q/k/v always have biases: a model without them exports zeros (the same function).
void add_zero_qkv_biases(const ModelDims& d, std::vector<SafetensorsItem>& items) {
  for (int64_t i = 0; i < d.num_layers; ++i) {
    const std::string B = fmt::format("model.layers.{}.self_attn.", i);
    auto [q, k, v] = split_qkv(Tensor::zeros({(d.heads + 2 * d.groups) * d.head_dim}), d.heads, d.groups, d.head_dim);
    items.push_back({B + "q_proj.bias", q});
    items.push_back({B + "k_proj.bias", k});
    items.push_back({B + "v_proj.bias", v});
  }
}

// mcpp trains with the GPT-2 BPE tokenizer, whose end-of-document id 50256 is HF's bos/eos; a smaller
// (test) vocab has no such token, so the ids are null rather than out of range.
void set_special_tokens(nlohmann::json& cfg, int64_t vocab) {
  constexpr int64_t kGpt2Eod = 50256;
  cfg["bos_token_id"] = vocab > kGpt2Eod ? nlohmann::json(kGpt2Eod) : nlohmann::json(nullptr);
  cfg["eos_token_id"] = cfg["bos_token_id"];
}

}  // namespace

void export_hf(const CheckpointReader& reader, HfFormat format, const std::string& out_dir) {
  if (!reader.meta().contains("config"))
    fail("{}: checkpoint meta has no 'config' (needed to export)", reader.dir());
  std::vector<SafetensorsItem> items;
  nlohmann::json cfg;
  const bool deepseek = format == HfFormat::DeepseekV2 || format == HfFormat::DeepseekV3;
  if (deepseek) export_deepseek(reader, format, items, cfg);
  ModelDims d = model_dims_from_config(reader.meta()["config"], reader.dir() + "/manifest.json meta.config");
  const bool moe_format = format == HfFormat::Mixtral || format == HfFormat::Qwen2Moe || format == HfFormat::Qwen3Moe;
  if (!deepseek && d.experts > 0 && !moe_format)  // GPT2LMHeadModel / LlamaForCausalLM / Qwen3ForCausalLM have dense MLPs
    fail("{} export: the checkpoint is a mixture-of-experts model (model.num_moe_experts {}); {} has dense MLPs "
         "(hf-mixtral / hf-qwen2-moe / hf-qwen3-moe write MoE models)", hf_format_name(format), d.experts,
         format == HfFormat::Gpt2    ? "GPT2LMHeadModel"
         : format == HfFormat::Qwen3 ? "Qwen3ForCausalLM"
         : format == HfFormat::Qwen2 ? "Qwen2ForCausalLM"
                                     : "LlamaForCausalLM");
  if (!deepseek && d.experts == 0 && moe_format)
    fail("{} export: model.num_moe_experts is 0 (a dense model); {} needs experts (hf-llama / hf-qwen2 / hf-qwen3 "
         "write dense Llama-style models)", hf_format_name(format), hf_format_name(format));
  if (moe_format) require_moe_routing(reader.meta()["config"]["model"], d, format);
  const int64_t mtp = get_int(reader.meta()["config"]["model"], "mtp_num_layers", reader.dir(), 0, false);
  if (mtp > 0 && !deepseek)  // none of the formats has a place for them: exporting would drop trained weights silently
    fail("{} export: model.mtp_num_layers is {} — the checkpoint holds multi-token prediction depths (mtp.layers.*) "
         "that {} has no place for; export would drop them (hf-deepseek-v3 writes them)", hf_format_name(format), mtp,
         hf_format_name(format));
  if (!deepseek && get_val<bool>(reader.meta()["config"]["model"], "multi_latent_attention", reader.dir(), false))
    fail("{} export: model.multi_latent_attention is true — the checkpoint's attention is multi-latent (linear_q_*_proj, "
         "linear_kv_*_proj), which {} has no place for (hf-deepseek-v2 / hf-deepseek-v3 write it)",
         hf_format_name(format), hf_format_name(format));
  if (!deepseek) {  // the config first: what the format cannot express fails before any tensor is read
    cfg = format == HfFormat::Gpt2 ? gpt2_config(d) : llama_config(d, format);
    const HfLayout l = hf_layout(d);
    export_pieces(reader, hf_pieces(model_tensors_from_config(reader.meta()["config"]), format, l), l, items);
    if ((format == HfFormat::Qwen2 || format == HfFormat::Qwen2Moe) && !d.qkv_bias)
      add_zero_qkv_biases(d, items);
  }
  set_special_tokens(cfg, d.vocab);
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) fail("cannot create output directory {}: {}", out_dir, ec.message());
  write_safetensors((fs::path(out_dir) / "model.safetensors").string(), items, {{"format", "pt"}},
                    /*fsync_file=*/true);
  write_text((fs::path(out_dir) / "config.json").string(), cfg.dump(2) + "\n");
}

}  // namespace mcpp::dist_checkpointing
