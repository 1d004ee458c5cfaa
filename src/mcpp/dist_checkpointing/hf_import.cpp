// Import of HF GPT-2 / Llama / Mixtral / Qwen2 / Qwen2-MoE / Qwen3 / Qwen3-MoE directories into a model-only
// checkpoint: config.json -> the model's dims here, the tensors through the model's own list and the format's rules
// (hf_rules.h); see hf_convert.h.
#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "mcpp/core/error.h"
#include "mcpp/dist_checkpointing/hf_convert.h"
#include "mcpp/dist_checkpointing/hf_deepseek.h"
#include "mcpp/dist_checkpointing/hf_rules.h"
#include "mcpp/dist_checkpointing/hf_tensors.h"

namespace fs = std::filesystem;

namespace mcpp::dist_checkpointing {
using namespace hf_detail;

namespace {

void check_model_type(const nlohmann::json& c, const std::string& path, const char* want) {
  if (!c.contains("model_type") || c["model_type"] != want)
    fail("{}: field 'model_type' is {} but the format needs \"{}\"", path,
         c.contains("model_type") ? c["model_type"].dump() : "missing", want);
}

ModelDims gpt2_dims(const nlohmann::json& c, const std::string& path) {
  check_model_type(c, path, "gpt2");
  std::string act = cfg_str(c, "activation_function", path, "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu_fast")
    fail("{}: field 'activation_function' is '{}'; mcpp computes the tanh GELU (gelu_new)", path, act);
  if (cfg_bool(c, "scale_attn_by_inverse_layer_idx", path, false))
    fail("{}: field 'scale_attn_by_inverse_layer_idx' must be false", path);
  if (!cfg_bool(c, "scale_attn_weights", path, true)) fail("{}: field 'scale_attn_weights' must be true", path);
  if (!cfg_bool(c, "tie_word_embeddings", path, true)) fail("{}: field 'tie_word_embeddings' must be true", path);
  ModelDims d;
  d.hidden = cfg_int(c, "n_embd", path);
  d.num_layers = cfg_int(c, "n_layer", path);
  d.heads = d.groups = cfg_int(c, "n_head", path);
  if (d.hidden % d.heads) fail("{}: n_embd {} is not a multiple of n_head {}", path, d.hidden, d.heads);
  d.head_dim = d.hidden / d.heads;
  d.ffn = c.contains("n_inner") && !c["n_inner"].is_null() ? cfg_int(c, "n_inner", path) : 4 * d.hidden;
  d.max_pos = cfg_int(c, "n_positions", path);
  d.vocab = cfg_int(c, "vocab_size", path);
  d.padded_vocab = padded_vocab(d.vocab);
  d.norm_eps = cfg_num(c, "layer_norm_epsilon", path, 1e-5);
  d.normalization = "LayerNorm";
  d.position_embedding = "learned_absolute";
  d.swiglu = false;
  d.untied = false;
  d.bias_linear = true;
  d.qkv_bias = true;
  return d;
}

// A rope type's parameters (transformers 4's rope_scaling, 5's rope_parameters; `field` names it): plain RoPE
// ("default", or no type) -> none; "linear" -> its factor (position interpolation); Llama 3's "llama3" -> its factor,
// with Megatron's fixed low / high frequency factors 1 / 4 and original context 8192 (other values are an error naming
// them); any other type is an error.
struct RopeScaling {
  double llama3 = 0.0, linear = 0.0;
  bool operator==(const RopeScaling&) const = default;
};
RopeScaling rope_scaling_of(const nlohmann::json& rp, const std::string& path, const char* field) {
  std::string type = "default";
  for (const char* key : {"rope_type", "type"})  // ("type": transformers' older spelling)
    if (rp.contains(key) && !rp[key].is_null()) type = cfg_str(rp, key, path + ": " + field, "default");
  if (type == "default") return {};
  if (type != "llama3" && type != "linear")
    fail("{}: field '{}.rope_type' is \"{}\"; mcpp implements plain RoPE (\"default\"), \"linear\" and Llama 3's "
         "\"llama3\"", path, field, type);
  const double factor = cfg_num(rp, "factor", path, 0.0);
  if (!(factor >= 1.0))
    fail("{}: field '{}.factor' is {}; {} RoPE scaling needs a factor >= 1", path, field, factor, type);
  if (type == "linear") return {.llama3 = 0.0, .linear = factor};
  const std::pair<const char*, double> fixed[] = {
      {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192.0}};
  for (const auto& [key, want] : fixed)
    if (cfg_num(rp, key, path, want) != want)
      fail("{}: field '{}.{}' is {}; mcpp's (Megatron's) llama3 RoPE scaling uses {}", path, field, key,
           cfg_num(rp, key, path, want), want);
  return {.llama3 = factor, .linear = 0.0};
}

// RoPE's base and scaling: transformers 4 writes rope_theta and rope_scaling (null for plain RoPE), transformers 5
// rope_parameters {rope_type, rope_theta, ...}; two different bases or scalings are an error.
double rope_base(const nlohmann::json& c, const std::string& path, RopeScaling* scaling) {
  double base = cfg_num(c, "rope_theta", path, 10000.0);
  const bool has_scaling = c.contains("rope_scaling") && !c["rope_scaling"].is_null();
  if (has_scaling && !c["rope_scaling"].is_object()) fail("{}: field 'rope_scaling' must be an object", path);
  *scaling = has_scaling ? rope_scaling_of(c["rope_scaling"], path, "rope_scaling") : RopeScaling{};
  auto it = c.find("rope_parameters");
  if (it == c.end() || it->is_null()) return base;
  if (!it->is_object()) fail("{}: field 'rope_parameters' must be an object", path);
  const nlohmann::json& rp = *it;
  const double theta = cfg_num(rp, "rope_theta", path, base);
  if (c.contains("rope_theta") && !c["rope_theta"].is_null() && theta != base)
    fail("{}: fields 'rope_theta' ({}) and 'rope_parameters.rope_theta' ({}) differ", path, base, theta);
  const RopeScaling from_parameters = rope_scaling_of(rp, path, "rope_parameters");
  if (has_scaling && !(from_parameters == *scaling))
    fail("{}: fields 'rope_scaling' and 'rope_parameters' give different RoPE scalings", path);
  *scaling = from_parameters;
  return theta;
}

// The fields Llama, Mixtral and Qwen2-MoE share: RMSNorm, RoPE, SwiGLU, GQA, no linear biases.
ModelDims llama_family_dims(const nlohmann::json& c, const std::string& path, const char* model_type) {
  check_model_type(c, path, model_type);
  if (cfg_str(c, "hidden_act", path, "silu") != "silu") fail("{}: field 'hidden_act' must be \"silu\"", path);
  ModelDims d;
  d.hidden = cfg_int(c, "hidden_size", path);
  d.num_layers = cfg_int(c, "num_hidden_layers", path);
  d.heads = cfg_int(c, "num_attention_heads", path);
  d.groups = c.contains("num_key_value_heads") && !c["num_key_value_heads"].is_null()
                 ? cfg_int(c, "num_key_value_heads", path)
                 : d.heads;
  if (d.heads % d.groups)
    fail("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", path, d.heads, d.groups);
  d.head_dim = c.contains("head_dim") && !c["head_dim"].is_null() ? cfg_int(c, "head_dim", path)
                                                                  : d.hidden / d.heads;
  d.ffn = cfg_int(c, "intermediate_size", path);
  d.max_pos = cfg_int(c, "max_position_embeddings", path);
  d.vocab = cfg_int(c, "vocab_size", path);
  d.padded_vocab = padded_vocab(d.vocab);
  d.norm_eps = cfg_num(c, "rms_norm_eps", path, 1e-6);
  RopeScaling scaling;
  d.rotary_base = rope_base(c, path, &scaling);
  d.rope_scaling_factor = scaling.llama3;
  d.rope_interpolation_factor = scaling.linear;
  d.normalization = "RMSNorm";
  d.position_embedding = "rope";
  d.swiglu = true;
  d.untied = !cfg_bool(c, "tie_word_embeddings", path, false);
  d.bias_linear = false;
  d.qkv_bias = false;
  return d;
}

ModelDims llama_dims(const nlohmann::json& c, const std::string& path, bool mixtral = false) {
  if (cfg_bool(c, "attention_bias", path, false)) fail("{}: field 'attention_bias' must be false", path);
  if (cfg_bool(c, "mlp_bias", path, false)) fail("{}: field 'mlp_bias' must be false", path);
  ModelDims d = llama_family_dims(c, path, mixtral ? "mixtral" : "llama");
  if (mixtral) {  // intermediate_size is the experts' width; Mixtral's sparse block on every layer
    d.experts = cfg_int(c, "num_local_experts", path);
    d.topk = cfg_int(c, "num_experts_per_tok", path);
    if (d.topk > d.experts)
      fail("{}: num_experts_per_tok {} exceeds num_local_experts {}", path, d.topk, d.experts);
    d.moe_ffn = d.ffn;
    d.moe_layers.assign(static_cast<size_t>(d.num_layers), true);
    if (c.contains("sliding_window") && !c["sliding_window"].is_null() &&
        cfg_int(c, "sliding_window", path) < d.max_pos)
      fail("{}: field 'sliding_window' ({}) is below max_position_embeddings ({}); mcpp's attention is full causal",
           path, c["sliding_window"].dump(), d.max_pos);
  }
  return d;
}

// Full causal attention in every layer: no sliding window, every layer_types entry "full_attention".
void require_full_attention(const nlohmann::json& c, const std::string& path) {
  if (cfg_bool(c, "use_sliding_window", path, false))
    fail("{}: field 'use_sliding_window' is true; mcpp's attention is full causal", path);
  if (c.contains("layer_types") && c["layer_types"].is_array())
    for (const auto& t : c["layer_types"])
      if (t != "full_attention")
        fail("{}: field 'layer_types' has {}; mcpp's attention is full causal (\"full_attention\")", path, t.dump());
}

// The Qwen MoE fields (Qwen2-MoE, Qwen3-MoE): experts, top-k, their width, the top-k normalization, and which layers
// route (every decoder_sparse_step-th, except mlp_only_layers).
// transformers 5 writes Qwen3-MoE's expert count as num_local_experts (4 and our export: num_experts).
void qwen_moe_fields(const nlohmann::json& c, const std::string& path, ModelDims& d) {
  const bool local = c.contains("num_local_experts") && !c["num_local_experts"].is_null();
  d.experts = cfg_int(c, local && !c.contains("num_experts") ? "num_local_experts" : "num_experts", path);
  if (local && cfg_int(c, "num_local_experts", path) != d.experts)
    fail("{}: fields 'num_experts' ({}) and 'num_local_experts' ({}) differ", path, d.experts,
         c["num_local_experts"].dump());
  d.topk = cfg_int(c, "num_experts_per_tok", path);
  if (d.topk > d.experts) fail("{}: num_experts_per_tok {} exceeds num_experts {}", path, d.topk, d.experts);
  d.moe_ffn = cfg_int(c, "moe_intermediate_size", path);
  d.moe_pre_softmax = !cfg_bool(c, "norm_topk_prob", path, false);  // the full softmax's top-k, unnormalized
  const int64_t step = c.contains("decoder_sparse_step") ? cfg_int(c, "decoder_sparse_step", path) : 1;
  std::set<int64_t> dense;
  if (c.contains("mlp_only_layers") && !c["mlp_only_layers"].is_null()) {
    if (!c["mlp_only_layers"].is_array()) fail("{}: field 'mlp_only_layers' must be a list of layer indices", path);
    for (const auto& v : c["mlp_only_layers"]) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= d.num_layers)
        fail("{}: field 'mlp_only_layers' has {}; entries are layer indices in [0, {})", path, v.dump(), d.num_layers);
      dense.insert(v.get<int64_t>());
    }
  }
  for (int64_t i = 0; i < d.num_layers; ++i) d.moe_layers.push_back(!dense.count(i) && (i + 1) % step == 0);
  if (std::find(d.moe_layers.begin(), d.moe_layers.end(), true) == d.moe_layers.end())
    fail("{}: no layer is a MoE layer (decoder_sparse_step {}, mlp_only_layers); import it as a dense layout "
         "instead", path, step);
}

ModelDims qwen2_moe_dims(const nlohmann::json& c, const std::string& path) {
  require_full_attention(c, path);
  ModelDims d = llama_family_dims(c, path, "qwen2_moe");  // intermediate_size: the dense layers' MLP
  d.qkv_bias = cfg_bool(c, "qkv_bias", path, true);  // Qwen2's q/k/v biases (transformers 5 can turn them off)
  qwen_moe_fields(c, path, d);
  d.shared_ffn = cfg_int(c, "shared_expert_intermediate_size", path);
  d.shared_gate = true;
  return d;
}

// Qwen2 (Qwen2.5): Llama's fields with q/k/v biases.
ModelDims qwen2_dims(const nlohmann::json& c, const std::string& path) {
  require_full_attention(c, path);
  ModelDims d = llama_family_dims(c, path, "qwen2");
  d.qkv_bias = cfg_bool(c, "qkv_bias", path, true);
  return d;
}

// Qwen3 / Qwen3-MoE: Llama's fields with q/k norms (our qk_layernorm); no attention biases (attention_bias true
// would also give o_proj a bias, which our linear_proj has only with add_bias_linear).
ModelDims qwen3_dims(const nlohmann::json& c, const std::string& path, bool moe) {
  require_full_attention(c, path);
  if (cfg_bool(c, "attention_bias", path, false)) fail("{}: field 'attention_bias' must be false", path);
  ModelDims d = llama_family_dims(c, path, moe ? "qwen3_moe" : "qwen3");
  d.qk_norm = true;
  if (moe) qwen_moe_fields(c, path, d);
  return d;
}

}  // namespace

CheckpointContents import_hf(const std::string& hf_dir, HfFormat format) {
  std::string cfg_path = (fs::path(hf_dir) / "config.json").string();
  if (format == HfFormat::DeepseekV2 || format == HfFormat::DeepseekV3) return import_deepseek(hf_dir, format);
  nlohmann::json c = read_hf_json(cfg_path);
  ModelDims d = format == HfFormat::Gpt2       ? gpt2_dims(c, cfg_path)
                : format == HfFormat::Qwen2Moe ? qwen2_moe_dims(c, cfg_path)
                : format == HfFormat::Qwen2    ? qwen2_dims(c, cfg_path)
                : format == HfFormat::Qwen3 || format == HfFormat::Qwen3Moe
                    ? qwen3_dims(c, cfg_path, format == HfFormat::Qwen3Moe)
                    : llama_dims(c, cfg_path, format == HfFormat::Mixtral);
  HfTensors hf(hf_dir);
  const bool gpt2 = format == HfFormat::Gpt2;
  int64_t moe_layers = 0;
  for (int64_t i = 0; i < d.num_layers; ++i) moe_layers += d.is_moe_layer(i) ? 1 : 0;
  hf.require_room(d.num_layers, moe_layers, d.experts,
                  gpt2 ? "'n_layer'" : format == HfFormat::Mixtral ? "'num_hidden_layers' / 'num_local_experts'"
                                                                   : "'num_hidden_layers' / 'num_experts'",
                  cfg_path);
  const HfLayout l = hf_layout(d);
  CheckpointContents out;
  out.iteration = 0;
  // GPT-2's original files lack the "transformer." prefix
  const std::string drop = gpt2 && !hf.has("transformer.wte.weight") ? "transformer." : "";
  out.tensors = import_pieces(hf, hf_pieces(model_param_shapes(d), format, l), l, drop);
  const bool tied = !d.untied;
  hf.check_all_used([gpt2, tied](const std::string& n) {
    if (gpt2)  // lm_head is tied to wte; attn.bias / attn.masked_bias are causal-mask buffers, not parameters
      return n == "lm_head.weight" || n.ends_with(".attn.bias") || n.ends_with(".attn.masked_bias");
    return n.find("rotary_emb.inv_freq") != std::string::npos || (tied && n == "lm_head.weight");
  });
  out.meta = {{"config", config_from_model_dims(d)},
              {"imported_from", {{"format", hf_format_name(format)}, {"path", fs::absolute(hf_dir).string()}}}};
  return out;
}

}  // namespace mcpp::dist_checkpointing
