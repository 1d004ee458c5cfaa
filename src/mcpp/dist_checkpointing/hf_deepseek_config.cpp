// DeepSeek-V2 / V3 dims: from / to our meta.config and from / to HF config.json; see hf_deepseek.h.
#include <cmath>

#include "mcpp/core/error.h"
#include "mcpp/dist_checkpointing/hf_deepseek.h"
#include "mcpp/dist_checkpointing/hf_tensors.h"

namespace mcpp::dist_checkpointing {
using namespace hf_detail;

namespace {

// meta.config.model readers: the default when absent, an error naming the field when of the wrong type
template <typename T>
T meta_val(const nlohmann::json& m, const char* name, const std::string& where, T dflt) {
  auto it = m.find(name);
  if (it == m.end() || it->is_null()) return dflt;
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    fail("{}: field model.{} has the wrong type: {}", where, name, it->dump());
  }
}

double yarn_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }
bool close(double a, double b) { return std::abs(a - b) <= 1e-6 * std::max(std::abs(a), std::abs(b)); }

// HF's latent norms (q_a_layernorm, kv_a_layernorm) are RMSNorms of a fixed epsilon 1e-6; ours share norm_epsilon.
constexpr double kHfLatentNormEps = 1e-6;

const char* model_type(HfFormat f) { return f == HfFormat::DeepseekV3 ? "deepseek_v3" : "deepseek_v2"; }

}  // namespace

int64_t DeepseekDims::first_k_dense() const {
  int64_t k = 0;
  while (k < m.num_layers && !m.is_moe_layer(k)) ++k;
  return k;
}

DeepseekDims deepseek_dims_from_config(const nlohmann::json& config, const std::string& where) {
  DeepseekDims d;
  d.m = model_dims_from_config(config, where);
  const nlohmann::json& m = config["model"];
  if (!meta_val<bool>(m, "multi_latent_attention", where, false))
    fail("{}: model.multi_latent_attention is false; DeepSeek's formats hold multi-latent attention (hf-llama / "
         "hf-mixtral / hf-qwen* write the standard attention)", where);
  d.q_lora_rank = meta_val<int64_t>(m, "q_lora_rank", where, 0);
  d.kv_lora_rank = meta_val<int64_t>(m, "kv_lora_rank", where, 32);
  d.qk_head_dim = meta_val<int64_t>(m, "qk_head_dim", where, 128);
  d.qk_pos_emb_head_dim = meta_val<int64_t>(m, "qk_pos_emb_head_dim", where, 64);
  d.v_head_dim = meta_val<int64_t>(m, "v_head_dim", where, 128);
  if (d.q_lora_rank < 0 || d.kv_lora_rank <= 0 || d.qk_head_dim <= 0 || d.v_head_dim <= 0 ||
      d.qk_pos_emb_head_dim <= 0 || d.qk_pos_emb_head_dim % 2)
    fail("{}: model.q_lora_rank / kv_lora_rank / qk_head_dim / qk_pos_emb_head_dim / v_head_dim out of range", where);
  const std::string rope = meta_val<std::string>(m, "rope_type", where, "");
  d.yarn = rope != "rope";  // "" = yarn, Megatron's MLA default
  d.rotary_scaling_factor = meta_val<double>(m, "rotary_scaling_factor", where, 1.0);
  d.mscale = meta_val<double>(m, "mscale", where, 1.0);
  d.mscale_all_dim = meta_val<double>(m, "mscale_all_dim", where, 0.0);
  d.beta_fast = meta_val<double>(m, "beta_fast", where, 32.0);
  d.beta_slow = meta_val<double>(m, "beta_slow", where, 1.0);
  d.original_max_pos = meta_val<int64_t>(m, "original_max_position_embeddings", where, 4096);
  d.sigmoid = meta_val<std::string>(m, "moe_router_score_function", where, "softmax") == "sigmoid";
  d.num_groups = meta_val<int64_t>(m, "moe_router_num_groups", where, 0);
  d.group_topk = meta_val<int64_t>(m, "moe_router_group_topk", where, 0);
  d.topk_scaling = meta_val<double>(m, "moe_router_topk_scaling_factor", where, 0.0);
  d.expert_bias = meta_val<bool>(m, "moe_router_enable_expert_bias", where, false);
  d.mtp = meta_val<int64_t>(m, "mtp_num_layers", where, 0);
  return d;
}

nlohmann::json config_from_deepseek_dims(const DeepseekDims& d) {
  ModelDims b = d.m;
  b.groups = b.heads;  // MLA: one key / value head per query head; kv_channels does not apply
  nlohmann::json j = config_from_model_dims(b);
  nlohmann::json& m = j["model"];
  m["multi_latent_attention"] = true;
  m["qk_layernorm"] = true;  // the latent norms (q_layernorm, kv_layernorm)
  m["q_lora_rank"] = d.q_lora_rank;
  m["kv_lora_rank"] = d.kv_lora_rank;
  m["qk_head_dim"] = d.qk_head_dim;
  m["qk_pos_emb_head_dim"] = d.qk_pos_emb_head_dim;
  m["v_head_dim"] = d.v_head_dim;
  m["rope_type"] = d.yarn ? "yarn" : "rope";
  m["rotary_scaling_factor"] = d.rotary_scaling_factor;
  m["mscale"] = d.mscale;
  m["mscale_all_dim"] = d.mscale_all_dim;
  m["beta_fast"] = d.beta_fast;
  m["beta_slow"] = d.beta_slow;
  m["original_max_position_embeddings"] = d.original_max_pos;
  if (d.m.experts > 0) {
    m["moe_router_score_function"] = d.sigmoid ? "sigmoid" : "softmax";
    m["moe_router_num_groups"] = d.num_groups;
    m["moe_router_group_topk"] = d.group_topk;
    m["moe_router_topk_scaling_factor"] = d.topk_scaling;
    m["moe_router_enable_expert_bias"] = d.expert_bias;
  }
  m["mtp_num_layers"] = d.mtp;
  return j;
}

nlohmann::json deepseek_hf_config(const DeepseekDims& d, HfFormat f) {
  const std::string F = hf_format_name(f);
  const bool v3 = f == HfFormat::DeepseekV3;
  const ModelDims& m = d.m;
  auto need = [&](bool ok, const char* field, const std::string& got, const std::string& want) {
    if (!ok) fail("{} export: model.{} is {} but {} needs {}", F, field, got, F, want);
  };
  auto str = [](double v) { return fmt::format("{}", v); };
  need(m.normalization == "RMSNorm", "normalization", m.normalization, "RMSNorm");
  need(m.swiglu, "swiglu", "false", "true");
  need(!m.bias_linear, "add_bias_linear", "true", "false");
  need(close(m.norm_eps, kHfLatentNormEps), "norm_epsilon", str(m.norm_eps),
       "1e-06 (HF's q_a_layernorm / kv_a_layernorm have a fixed epsilon 1e-6)");
  need(m.experts > 0, "num_moe_experts", "0", "experts (DeepSeek's MoE layers)");
  const int64_t k = d.first_k_dense();
  bool first_k = k < m.num_layers;
  for (int64_t i = k; i < m.num_layers; ++i) first_k = first_k && m.is_moe_layer(i);
  need(first_k, "moe_layer_freq", "a pattern other than dense layers then MoE layers",
       "[0]*first_k_dense_replace + [1]*(num_layers - first_k_dense_replace), at least one MoE layer");
  need(m.shared_ffn > 0 && m.shared_ffn % m.moe_ffn == 0, "moe_shared_expert_intermediate_size",
       std::to_string(m.shared_ffn), "a positive multiple of moe_ffn_hidden_size (n_shared_experts experts' width)");
  need(!m.shared_gate, "moe_shared_expert_gate", "true", "false (DeepSeek's shared experts are not gated)");
  // the softmax scale: ours mscale(rotary_scaling_factor, mscale_all_dim)^2 / sqrt(dn + dr) with either rope type; V2
  // and V3's plain rope have none, V3's yarn the same as ours
  const double softmax_mscale = yarn_mscale(d.rotary_scaling_factor, d.mscale_all_dim);
  if (!d.yarn || !v3)
    need(softmax_mscale == 1.0, "mscale_all_dim", str(d.mscale_all_dim),
         fmt::format("0 or rotary_scaling_factor <= 1 ({}'s softmax scale has no mscale{})", F,
                     d.yarn ? "" : " with plain rope"));
  nlohmann::json rope_scaling = nullptr;
  int64_t max_pos = m.max_pos;
  if (d.yarn) {
    // transformers: factor = max_position_embeddings / original_max_position_embeddings; the cos / sin scale
    // mscale(f, mscale) / mscale(f, mscale_all_dim) only when both are non-zero, else mscale(f, 1)
    const double f_pos = d.rotary_scaling_factor * static_cast<double>(d.original_max_pos);
    need(f_pos == std::round(f_pos), "rotary_scaling_factor", str(d.rotary_scaling_factor),
         "a factor x original_max_position_embeddings that is an integer (HF's max_position_embeddings)");
    max_pos = static_cast<int64_t>(f_pos);
    const double ours = yarn_mscale(d.rotary_scaling_factor, d.mscale) /
                        yarn_mscale(d.rotary_scaling_factor, d.mscale_all_dim);
    const double hf = d.mscale != 0.0 && d.mscale_all_dim != 0.0 ? ours : yarn_mscale(d.rotary_scaling_factor, 1.0);
    need(close(ours, hf), "mscale", str(d.mscale), "1 when mscale_all_dim is 0 (transformers' YaRN cos / sin scale)");
    rope_scaling = {{"type", "yarn"},          {"rope_type", "yarn"},
                    {"factor", d.rotary_scaling_factor}, {"original_max_position_embeddings", d.original_max_pos},
                    {"beta_fast", d.beta_fast}, {"beta_slow", d.beta_slow},
                    {"mscale", d.mscale},      {"mscale_all_dim", d.mscale_all_dim}};
  }
  nlohmann::json rope_parameters = rope_scaling.is_null() ? nlohmann::json{{"rope_type", "default"}} : rope_scaling;
  rope_parameters.erase("type");
  rope_parameters["rope_theta"] = m.rotary_base;
  const int64_t per_group = m.experts / std::max<int64_t>(d.num_groups, 1);
  const bool all_groups = d.num_groups == 0 || d.group_topk == d.num_groups;  // no group excluded: plain top-k
  nlohmann::json cfg = {{"architectures", {v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM"}},
                        {"model_type", model_type(f)},
                        {"vocab_size", m.vocab},
                        {"hidden_size", m.hidden},
                        {"intermediate_size", m.ffn},
                        {"moe_intermediate_size", m.moe_ffn},
                        {"num_hidden_layers", m.num_layers},
                        {"num_attention_heads", m.heads},
                        {"num_key_value_heads", m.heads},
                        {"n_shared_experts", m.shared_ffn / m.moe_ffn},
                        {"n_routed_experts", m.experts},
                        {"num_experts_per_tok", m.topk},
                        {"routed_scaling_factor", d.topk_scaling > 0.0 ? d.topk_scaling : 1.0},
                        {"kv_lora_rank", d.kv_lora_rank},
                        {"q_lora_rank", d.q_lora_rank > 0 ? nlohmann::json(d.q_lora_rank) : nlohmann::json(nullptr)},
                        {"qk_rope_head_dim", d.qk_pos_emb_head_dim},
                        {"qk_nope_head_dim", d.qk_head_dim},
                        {"v_head_dim", d.v_head_dim},
                        {"first_k_dense_replace", k},
                        {"moe_layer_freq", 1},
                        {"hidden_act", "silu"},
                        {"max_position_embeddings", max_pos},
                        {"rms_norm_eps", m.norm_eps},
                        {"tie_word_embeddings", !m.untied},
                        {"rope_theta", m.rotary_base},
                        {"rope_scaling", rope_scaling},
                        {"rope_parameters", rope_parameters},
                        {"attention_bias", false},
                        {"attention_dropout", 0.0},
                        {"initializer_range", 0.02},
                        {"use_cache", true},
                        {"torch_dtype", "float32"}};
  if (v3) {
    need(d.sigmoid, "moe_router_score_function", "softmax", "sigmoid (hf-deepseek-v2 writes softmax routing)");
    // groups ranked by their top-2 scores' sum: ours ranks by the top topk / group_topk
    if (all_groups) {
      need(m.experts >= 2, "num_moe_experts", std::to_string(m.experts), "at least 2 (HF ranks groups by a top-2)");
    } else {
      need(m.topk == 2 * d.group_topk && per_group >= 2, "moe_router_group_topk", std::to_string(d.group_topk),
           fmt::format("moe_router_topk / 2 = {} with >= 2 experts a group (DeepSeek-V3 ranks groups by the sum of "
                       "their top-2 scores; ours by the top moe_router_topk / moe_router_group_topk)", m.topk / 2));
    }
    cfg["n_group"] = all_groups ? 1 : d.num_groups;
    cfg["topk_group"] = all_groups ? 1 : d.group_topk;
    cfg["norm_topk_prob"] = m.topk > 1;  // ours: the top-k sigmoid scores renormalized when k > 1
    cfg["scoring_func"] = "sigmoid";
    cfg["topk_method"] = "noaux_tc";
    cfg["rope_interleave"] = true;
    cfg["num_nextn_predict_layers"] = d.mtp;
  } else {
    need(!d.sigmoid, "moe_router_score_function", "sigmoid", "softmax (hf-deepseek-v3 writes sigmoid routing)");
    need(m.moe_pre_softmax, "moe_router_pre_softmax", "false",
         "true (transformers' DeepseekV2 takes the full softmax's top-k unnormalized)");
    need(!d.expert_bias, "moe_router_enable_expert_bias", "true", "false (DeepSeek-V2 has no expert bias)");
    need(d.mtp == 0, "mtp_num_layers", std::to_string(d.mtp), "0 (DeepSeek-V2 has no MTP layers; hf-deepseek-v3)");
    if (!all_groups)
      need(m.topk == d.group_topk, "moe_router_group_topk", std::to_string(d.group_topk),
           fmt::format("moe_router_topk = {} (group_limited_greedy ranks groups by their best score; ours by the "
                       "top moe_router_topk / moe_router_group_topk)", m.topk));
    cfg["topk_method"] = all_groups ? "greedy" : "group_limited_greedy";
    cfg["n_group"] = all_groups ? 1 : d.num_groups;
    cfg["topk_group"] = all_groups ? 1 : d.group_topk;
    cfg["norm_topk_prob"] = false;
    cfg["scoring_func"] = "softmax";
  }
  return cfg;
}

DeepseekDims deepseek_dims_from_hf(const nlohmann::json& c, const std::string& path, HfFormat f, bool mtp_present) {
  const bool v3 = f == HfFormat::DeepseekV3;
  if (!c.contains("model_type") || c["model_type"] != model_type(f))
    fail("{}: field 'model_type' is {} but the format needs \"{}\"", path,
         c.contains("model_type") ? c["model_type"].dump() : "missing", model_type(f));
  auto bad = [&](const char* field, const std::string& why) {
    fail("{}: field '{}' is {}; {}", path, field, c.contains(field) ? c[field].dump() : "missing", why);
  };
  if (cfg_has(c, "quantization_config"))  // DeepSeek-V3's release: FP8 blocks with weight_scale_inv tensors
    bad("quantization_config", "mcpp imports F32 / F16 / BF16 weights (dequantize an FP8 checkpoint to BF16 first)");
  if (cfg_str(c, "hidden_act", path, "silu") != "silu") bad("hidden_act", "mcpp's SwiGLU needs \"silu\"");
  if (cfg_bool(c, "attention_bias", path, false)) bad("attention_bias", "MLA's projections have no biases");
  if (cfg_bool(c, "mlp_bias", path, false)) bad("mlp_bias", "mcpp's DeepSeek MLPs have no biases");
  auto count = [&](const char* field, int64_t dflt) {  // a non-negative integer, absent / null: dflt
    if (!cfg_has(c, field)) return dflt;
    if (!c[field].is_number_integer() || c[field].get<int64_t>() < 0) bad(field, "a non-negative integer");
    return c[field].get<int64_t>();
  };
  DeepseekDims d;
  ModelDims& m = d.m;
  m.hidden = cfg_int(c, "hidden_size", path);
  m.num_layers = cfg_int(c, "num_hidden_layers", path);
  m.heads = m.groups = cfg_int(c, "num_attention_heads", path);
  if (cfg_has(c, "num_key_value_heads") && cfg_int(c, "num_key_value_heads", path) != m.heads)
    bad("num_key_value_heads", "MLA has one key / value head per query head (num_attention_heads)");
  m.ffn = cfg_int(c, "intermediate_size", path);
  m.vocab = cfg_int(c, "vocab_size", path);
  m.padded_vocab = padded_vocab(m.vocab);
  m.max_pos = cfg_int(c, "max_position_embeddings", path);
  m.norm_eps = cfg_num(c, "rms_norm_eps", path, 1e-6);
  if (!close(m.norm_eps, kHfLatentNormEps))
    bad("rms_norm_eps", "mcpp's latent norms share the model's epsilon and HF's are fixed at 1e-6");
  m.normalization = "RMSNorm", m.position_embedding = "rope", m.swiglu = true;
  m.bias_linear = false, m.qkv_bias = false;
  m.untied = !cfg_bool(c, "tie_word_embeddings", path, false);
  if (!c.contains("q_lora_rank")) bad("q_lora_rank", "it must be given (null: no query compression)");
  d.q_lora_rank = c["q_lora_rank"].is_null() ? 0 : cfg_int(c, "q_lora_rank", path);
  d.kv_lora_rank = cfg_int(c, "kv_lora_rank", path);
  d.qk_head_dim = cfg_int(c, "qk_nope_head_dim", path);
  d.qk_pos_emb_head_dim = cfg_int(c, "qk_rope_head_dim", path);
  if (d.qk_pos_emb_head_dim % 2) bad("qk_rope_head_dim", "its channels rotate in pairs (an even number)");
  d.v_head_dim = cfg_int(c, "v_head_dim", path);
  m.head_dim = m.hidden / m.heads;  // kv_channels does not apply to MLA: the default a recipe finalizes to
  if (v3 && !cfg_bool(c, "rope_interleave", path, true))
    bad("rope_interleave", "mcpp's MLA rotates interleaved channel pairs (DeepSeek's released layout, true)");
  // RoPE: rope_scaling (transformers 4) or rope_parameters (5): plain, or YaRN
  nlohmann::json rp = cfg_has(c, "rope_scaling") ? c["rope_scaling"] : nlohmann::json(nullptr);
  if (!rp.is_null() && !rp.is_object()) bad("rope_scaling", "an object or null");
  if (rp.is_null() && cfg_has(c, "rope_parameters")) rp = c["rope_parameters"];
  if (!rp.is_null() && !rp.is_object()) bad("rope_parameters", "an object or null");
  m.rotary_base = cfg_num(c, "rope_theta", path, rp.is_object() ? cfg_num(rp, "rope_theta", path, 10000.0) : 10000.0);
  const std::string rpath = path + " rope_scaling";
  std::string type = "default";
  if (rp.is_object())
    for (const char* key : {"type", "rope_type"})
      if (cfg_has(rp, key)) type = cfg_str(rp, key, rpath, "default");
  if (type == "yarn") {
    d.yarn = true;
    d.rotary_scaling_factor = cfg_num(rp, "factor", rpath, 1.0);
    d.original_max_pos = cfg_has(rp, "original_max_position_embeddings")
                             ? cfg_int(rp, "original_max_position_embeddings", rpath)
                             : m.max_pos;
    d.beta_fast = cfg_num(rp, "beta_fast", rpath, 32.0);
    d.beta_slow = cfg_num(rp, "beta_slow", rpath, 1.0);
    d.mscale = cfg_num(rp, "mscale", rpath, 1.0);
    d.mscale_all_dim = cfg_num(rp, "mscale_all_dim", rpath, 0.0);
    if (!cfg_bool(rp, "truncate", rpath, true))
      bad("rope_scaling", "YaRN with truncate false; mcpp's (Megatron's) correction range is truncated");
    if (cfg_has(rp, "original_max_position_embeddings") &&
        !close(d.rotary_scaling_factor, static_cast<double>(m.max_pos) / static_cast<double>(d.original_max_pos)))
      bad("max_position_embeddings", fmt::format("transformers takes YaRN's factor as max_position_embeddings / "
                                                 "original_max_position_embeddings, which differs from factor {}",
                                                 d.rotary_scaling_factor));
    const double ours = yarn_mscale(d.rotary_scaling_factor, d.mscale) /
                        yarn_mscale(d.rotary_scaling_factor, d.mscale_all_dim);
    const double hf = cfg_has(rp, "attention_factor") ? cfg_num(rp, "attention_factor", rpath, 1.0)
                      : d.mscale != 0.0 && d.mscale_all_dim != 0.0 ? ours
                                                                   : yarn_mscale(d.rotary_scaling_factor, 1.0);
    if (!close(ours, hf))
      bad("rope_scaling", fmt::format("its cos / sin scale {} differs from Megatron's mscale(factor, mscale) / "
                                      "mscale(factor, mscale_all_dim) = {}", hf, ours));
    if (!v3 && yarn_mscale(d.rotary_scaling_factor, d.mscale_all_dim) != 1.0)
      bad("rope_scaling", "transformers' DeepseekV2 has no mscale_all_dim softmax scale, which mcpp's MLA applies");
  } else if (type != "default") {
    bad("rope_scaling", "mcpp's MLA implements plain RoPE and YaRN (\"yarn\")");
  }
  // mixture of experts: dense layers first, then MoE layers
  m.experts = cfg_int(c, "n_routed_experts", path);
  m.topk = cfg_int(c, "num_experts_per_tok", path);
  if (m.topk > m.experts) bad("num_experts_per_tok", "more than n_routed_experts");
  m.moe_ffn = cfg_int(c, "moe_intermediate_size", path);
  m.shared_ffn = cfg_int(c, "n_shared_experts", path) * m.moe_ffn;
  if (cfg_has(c, "moe_layer_freq") && c["moe_layer_freq"] != 1)
    bad("moe_layer_freq", "transformers' DeepSeek makes every layer from first_k_dense_replace on a MoE layer (1)");
  const int64_t k = count("first_k_dense_replace", v3 ? 3 : 0);
  if (k < 0 || k >= m.num_layers) bad("first_k_dense_replace", "it must leave at least one MoE layer");
  for (int64_t i = 0; i < m.num_layers; ++i) m.moe_layers.push_back(i >= k);
  d.topk_scaling = cfg_num(c, "routed_scaling_factor", path, v3 ? 2.5 : 1.0);
  if (!(d.topk_scaling > 0.0)) bad("routed_scaling_factor", "it must be positive");
  const bool norm = cfg_bool(c, "norm_topk_prob", path, v3);
  const int64_t n_group = cfg_has(c, "n_group") ? cfg_int(c, "n_group", path) : 1;
  const int64_t topk_group = cfg_has(c, "topk_group") ? cfg_int(c, "topk_group", path) : n_group;
  if (topk_group > n_group) bad("topk_group", "more than n_group");
  if (v3) {
    d.sigmoid = true, d.expert_bias = true;
    if (cfg_str(c, "scoring_func", path, "sigmoid") != "sigmoid") bad("scoring_func", "DeepSeek-V3 is \"sigmoid\"");
    if (norm != (m.topk > 1))
      bad("norm_topk_prob", "mcpp renormalizes the top-k sigmoid scores exactly when num_experts_per_tok > 1");
    if (m.experts < 2 * n_group) bad("n_group", "DeepSeek-V3 ranks groups by their top-2: >= 2 experts a group");
    if (n_group > 1 && topk_group < n_group) {
      if (m.topk != 2 * topk_group)
        bad("topk_group", "mcpp ranks groups by their top num_experts_per_tok / topk_group scores and DeepSeek-V3 by "
                          "their top 2: num_experts_per_tok must be 2 x topk_group");
      d.num_groups = n_group, d.group_topk = topk_group;
    }
    d.mtp = mtp_present ? count("num_nextn_predict_layers", 0) : 0;
  } else {
    if (cfg_str(c, "scoring_func", path, "softmax") != "softmax") bad("scoring_func", "DeepSeek-V2 is \"softmax\"");
    if (norm && m.topk > 1)
      bad("norm_topk_prob", "transformers' DeepseekV2 never renormalizes the top-k (mcpp follows it: false)");
    m.moe_pre_softmax = true;
    const std::string method = cfg_str(c, "topk_method", path, "greedy");
    if (method == "group_limited_greedy" && topk_group < n_group) {
      if (m.topk != topk_group)
        bad("topk_group", "mcpp ranks groups by their top num_experts_per_tok / topk_group scores and "
                          "group_limited_greedy by their best one: num_experts_per_tok must equal topk_group");
      d.num_groups = n_group, d.group_topk = topk_group;
    } else if (method != "greedy" && method != "group_limited_greedy") {
      bad("topk_method", "mcpp implements DeepSeek-V2's \"greedy\" and \"group_limited_greedy\"");
    }
  }
  if (d.num_groups > 0 && (d.num_groups > 64 || m.experts % d.num_groups))
    bad("n_group", "it must divide n_routed_experts and be at most 64");
  return d;
}

}  // namespace mcpp::dist_checkpointing
