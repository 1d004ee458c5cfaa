// The rule table of each HF format: our key pattern -> HF name patterns and the transform; see hf_rules.h. The one
// place a parameter's HF name is spelled (hf_pieces.cpp applies them).
#include "mcpp/dist_checkpointing/hf_rules.h"

#include "mcpp/core/error.h"

namespace mcpp::dist_checkpointing {

namespace {

using R = std::vector<HfRule>;

// SwiGLU's MLP under ours `X` / HF's `Y`: fc1 [gate; up] -> gate_proj, up_proj; fc2 -> down_proj.
void swiglu(R& r, const std::string& X, const std::string& Y) {
  r.push_back({X + "linear_fc1.weight", HfOp::Rows, {Y + "gate_proj.weight", Y + "up_proj.weight"}});
  r.push_back({X + "linear_fc2.weight", HfOp::Same, {Y + "down_proj.weight"}});
}

// A MoE layer's experts under ours `L` / HF's `E` ("...experts.{e}."), with transformers 5's fused form under HF's
// layer `H`; gate / up / down: the HF projection names (Mixtral: w1, w3, w2).
void experts(R& r, const std::string& L, const std::string& H, const std::string& E, const char* gate, const char* up,
             const char* down) {
  const std::string X = L + "mlp.experts.local_experts.{e}.";
  r.push_back({X + "linear_fc1.weight", HfOp::Rows, {E + gate + ".weight", E + up + ".weight"},
               H + "mlp.experts.gate_up_proj"});
  r.push_back({X + "linear_fc2.weight", HfOp::Same, {E + down + ".weight"}, H + "mlp.experts.down_proj"});
}

// GPT2LMHeadModel: Conv1D weights [in, out], c_attn = [q | k | v], a tied lm_head (not stored).
R gpt2_rules() {
  const std::string L = "decoder.layers.{i}.", H = "transformer.h.{i}.";
  return {
      {"embedding.word_embeddings.weight", HfOp::Vocab, {"transformer.wte.weight"}},
      {"embedding.position_embeddings.weight", HfOp::Same, {"transformer.wpe.weight"}},
      {L + "input_layernorm.weight", HfOp::Same, {H + "ln_1.weight"}},
      {L + "input_layernorm.bias", HfOp::Same, {H + "ln_1.bias"}},
      {L + "self_attention.linear_qkv.weight", HfOp::QkvCatT, {H + "attn.c_attn.weight"}},
      {L + "self_attention.linear_qkv.bias", HfOp::QkvCat, {H + "attn.c_attn.bias"}},
      {L + "self_attention.linear_proj.weight", HfOp::Transpose, {H + "attn.c_proj.weight"}},
      {L + "self_attention.linear_proj.bias", HfOp::Same, {H + "attn.c_proj.bias"}},
      {L + "pre_mlp_layernorm.weight", HfOp::Same, {H + "ln_2.weight"}},
      {L + "pre_mlp_layernorm.bias", HfOp::Same, {H + "ln_2.bias"}},
      {L + "mlp.linear_fc1.weight", HfOp::Transpose, {H + "mlp.c_fc.weight"}},
      {L + "mlp.linear_fc1.bias", HfOp::Same, {H + "mlp.c_fc.bias"}},
      {L + "mlp.linear_fc2.weight", HfOp::Transpose, {H + "mlp.c_proj.weight"}},
      {L + "mlp.linear_fc2.bias", HfOp::Same, {H + "mlp.c_proj.bias"}},
      {"decoder.final_layernorm.weight", HfOp::Same, {"transformer.ln_f.weight"}},
      {"decoder.final_layernorm.bias", HfOp::Same, {"transformer.ln_f.bias"}},
  };
}

// LlamaForCausalLM and its relatives: Qwen2 / Qwen2-MoE add q/k/v biases, Qwen3 / Qwen3-MoE q/k norms; Mixtral's
// experts are block_sparse_moe's w1 (gate) / w3 (up) / w2 (down), the Qwens' mlp.experts' gate/up/down_proj, and
// Qwen2-MoE's shared expert is gated.
R llama_rules(HfFormat f) {
  const bool qkv_bias = f == HfFormat::Qwen2 || f == HfFormat::Qwen2Moe;
  const bool qk_norm = f == HfFormat::Qwen3 || f == HfFormat::Qwen3Moe;
  const std::string L = "decoder.layers.{i}.", H = "model.layers.{i}.";
  const std::string A = L + "self_attention.", B = H + "self_attn.";
  R r = {
      {"embedding.word_embeddings.weight", HfOp::Vocab, {"model.embed_tokens.weight"}},
      {L + "input_layernorm.weight", HfOp::Same, {H + "input_layernorm.weight"}},
      {A + "linear_qkv.weight", HfOp::Qkv, {B + "q_proj.weight", B + "k_proj.weight", B + "v_proj.weight"}},
      {A + "linear_proj.weight", HfOp::Same, {B + "o_proj.weight"}},
      {L + "pre_mlp_layernorm.weight", HfOp::Same, {H + "post_attention_layernorm.weight"}},
      {"decoder.final_layernorm.weight", HfOp::Same, {"model.norm.weight"}},
      {"output_layer.weight", HfOp::Vocab, {"lm_head.weight"}},
  };
  if (qkv_bias) r.push_back({A + "linear_qkv.bias", HfOp::Qkv, {B + "q_proj.bias", B + "k_proj.bias", B + "v_proj.bias"}});
  if (qk_norm) {
    r.push_back({A + "q_layernorm.weight", HfOp::Same, {B + "q_norm.weight"}});
    r.push_back({A + "k_layernorm.weight", HfOp::Same, {B + "k_norm.weight"}});
  }
  swiglu(r, L + "mlp.", H + "mlp.");  // the dense layers
  if (f == HfFormat::Mixtral) {
    const std::string M = H + "block_sparse_moe.";
    r.push_back({L + "mlp.router.weight", HfOp::Same, {M + "gate.weight"}, H + "mlp.gate.weight"});
    experts(r, L, H, M + "experts.{e}.", "w1", "w3", "w2");
  }
  if (f == HfFormat::Qwen2Moe || f == HfFormat::Qwen3Moe) {
    r.push_back({L + "mlp.router.weight", HfOp::Same, {H + "mlp.gate.weight"}});
    experts(r, L, H, H + "mlp.experts.{e}.", "gate_proj", "up_proj", "down_proj");
  }
  if (f == HfFormat::Qwen2Moe) {
    swiglu(r, L + "mlp.shared_experts.", H + "mlp.shared_expert.");
    r.push_back({L + "mlp.shared_experts.gate_weight", HfOp::Same, {H + "mlp.shared_expert_gate.weight"}});
  }
  return r;
}

// One DeepSeek transformer layer: ours under `L`, HF's under `H` (a decoder layer, or an MTP depth's).
void deepseek_layer(R& r, HfFormat f, const std::string& L, const std::string& H) {
  const std::string A = L + "self_attention.", B = H + "self_attn.";
  const R layer = {
      {L + "input_layernorm.weight", HfOp::Same, {H + "input_layernorm.weight"}},
      {A + "linear_q_down_proj.weight", HfOp::Same, {B + "q_a_proj.weight"}},
      {A + "linear_q_up_proj.weight", HfOp::Same, {B + "q_b_proj.weight"}},
      {A + "linear_q_proj.weight", HfOp::Same, {B + "q_proj.weight"}},
      {A + "linear_kv_down_proj.weight", HfOp::Same, {B + "kv_a_proj_with_mqa.weight"}},
      {A + "linear_kv_up_proj.weight", HfOp::Same, {B + "kv_b_proj.weight"}},
      {A + "linear_proj.weight", HfOp::Same, {B + "o_proj.weight"}},
      {A + "q_layernorm.weight", HfOp::Same, {B + "q_a_layernorm.weight"}},
      {A + "kv_layernorm.weight", HfOp::Same, {B + "kv_a_layernorm.weight"}},
      {L + "pre_mlp_layernorm.weight", HfOp::Same, {H + "post_attention_layernorm.weight"}},
      {L + "mlp.router.weight", HfOp::Same, {H + "mlp.gate.weight"}},
  };
  r.insert(r.end(), layer.begin(), layer.end());
  swiglu(r, L + "mlp.", H + "mlp.");
  experts(r, L, H, H + "mlp.experts.{e}.", "gate_proj", "up_proj", "down_proj");
  swiglu(r, L + "mlp.shared_experts.", H + "mlp.shared_experts.");
  if (f == HfFormat::DeepseekV3)  // V2's router has no bias
    r.push_back({L + "mlp.router.expert_bias", HfOp::Same, {H + "mlp.gate.e_score_correction_bias"}});
}

// DeepseekV2ForCausalLM / DeepseekV3ForCausalLM; MTP depth k is HF layer num_layers + k (DeepSeek's MTP module).
R deepseek_rules(HfFormat f) {
  R r = {
      {"embedding.word_embeddings.weight", HfOp::Vocab, {"model.embed_tokens.weight"}},
      {"decoder.final_layernorm.weight", HfOp::Same, {"model.norm.weight"}},
      {"output_layer.weight", HfOp::Vocab, {"lm_head.weight"}},
      {"mtp.layers.{k}.enorm.weight", HfOp::Same, {"model.layers.{m}.enorm.weight"}},
      {"mtp.layers.{k}.hnorm.weight", HfOp::Same, {"model.layers.{m}.hnorm.weight"}},
      {"mtp.layers.{k}.eh_proj.weight", HfOp::Same, {"model.layers.{m}.eh_proj.weight"}},
      {"mtp.layers.{k}.final_layernorm.weight", HfOp::Same, {"model.layers.{m}.shared_head.norm.weight"}},
  };
  deepseek_layer(r, f, "decoder.layers.{i}.", "model.layers.{i}.");
  deepseek_layer(r, f, "mtp.layers.{k}.transformer_layer.", "model.layers.{m}.");
  return r;
}

R rules_of(HfFormat f) {
  switch (f) {
    case HfFormat::Gpt2: return gpt2_rules();
    case HfFormat::DeepseekV2:
    case HfFormat::DeepseekV3: return deepseek_rules(f);
    default: return llama_rules(f);
  }
}

}  // namespace

const std::vector<HfRule>& hf_rules(HfFormat f) {
  static const std::map<HfFormat, R> all = [] {
    std::map<HfFormat, R> m;
    for (HfFormat g : {HfFormat::Gpt2, HfFormat::Llama, HfFormat::Mixtral, HfFormat::Qwen2Moe, HfFormat::Qwen3,
                       HfFormat::Qwen3Moe, HfFormat::Qwen2, HfFormat::DeepseekV2, HfFormat::DeepseekV3})
      m[g] = rules_of(g);
    return m;
  }();
  return all.at(f);
}

}  // namespace mcpp::dist_checkpointing
