// DeepSeek-V2 / V3 tensors: our key set, the HF name of every piece, export and import; see hf_deepseek.h.
#include "mcpp/dist_checkpointing/hf_deepseek.h"

#include <cstring>
#include <filesystem>
#include <map>

#include "mcpp/core/error.h"
#include "mcpp/dist_checkpointing/hf_tensor_ops.h"
#include "mcpp/dist_checkpointing/hf_tensors.h"

namespace fs = std::filesystem;

namespace mcpp::dist_checkpointing {
using namespace hf_detail;

namespace {

// The pieces of one transformer layer: ours under `L` ("decoder.layers.{i}." or "mtp.layers.{k}.transformer_layer."),
// HF's under `H` ("model.layers.{j}.").
void layer_pieces(const DeepseekDims& d, HfFormat f, const std::string& L, const std::string& H, bool moe,
                  std::vector<DeepseekPiece>& out) {
  const ModelDims& m = d.m;
  const int64_t h = m.hidden, n = m.heads, dq = d.qk_head_dim + d.qk_pos_emb_head_dim;
  auto one = [&](const std::string& ours, const std::string& hf, const Shape& s) {
    out.push_back({ours, s, {{hf, s}}});
  };
  auto swiglu = [&](const std::string& X, const std::string& Y, int64_t w) {  // [gate; up], down
    out.push_back({X + "linear_fc1.weight", {2 * w, h}, {{Y + "gate_proj.weight", {w, h}}, {Y + "up_proj.weight", {w, h}}}});
    one(X + "linear_fc2.weight", Y + "down_proj.weight", {h, w});
  };
  const std::string A = L + "self_attention.", B = H + "self_attn.";
  one(L + "input_layernorm.weight", H + "input_layernorm.weight", {h});
  if (d.q_lora_rank > 0) {
    one(A + "linear_q_down_proj.weight", B + "q_a_proj.weight", {d.q_lora_rank, h});
    one(A + "linear_q_up_proj.weight", B + "q_b_proj.weight", {n * dq, d.q_lora_rank});
  } else {
    one(A + "linear_q_proj.weight", B + "q_proj.weight", {n * dq, h});
  }
  one(A + "linear_kv_down_proj.weight", B + "kv_a_proj_with_mqa.weight", {d.kv_lora_rank + d.qk_pos_emb_head_dim, h});
  one(A + "linear_kv_up_proj.weight", B + "kv_b_proj.weight", {n * (d.qk_head_dim + d.v_head_dim), d.kv_lora_rank});
  one(A + "linear_proj.weight", B + "o_proj.weight", {h, n * d.v_head_dim});
  if (d.q_lora_rank > 0) one(A + "q_layernorm.weight", B + "q_a_layernorm.weight", {d.q_lora_rank});
  one(A + "kv_layernorm.weight", B + "kv_a_layernorm.weight", {d.kv_lora_rank});
  one(L + "pre_mlp_layernorm.weight", H + "post_attention_layernorm.weight", {h});
  if (!moe) {
    swiglu(L + "mlp.", H + "mlp.", m.ffn);
    return;
  }
  one(L + "mlp.router.weight", H + "mlp.gate.weight", {m.experts, h});
  for (int64_t e = 0; e < m.experts; ++e)
    swiglu(fmt::format("{}mlp.experts.local_experts.{}.", L, e), fmt::format("{}mlp.experts.{}.", H, e), m.moe_ffn);
  swiglu(L + "mlp.shared_experts.", H + "mlp.shared_experts.", m.shared_ffn);
  if (d.expert_bias && f == HfFormat::DeepseekV3)
    one(L + "mlp.router.expert_bias", H + "mlp.gate.e_score_correction_bias", {m.experts});
}

// Our tensor -> its HF pieces (rows beyond theirs: the vocabulary's zero padding, dropped).
void split_piece(const DeepseekPiece& p, const Tensor& t, std::vector<SafetensorsItem>& items) {
  int64_t row = 0;
  for (const auto& [name, shape] : p.hf) {
    items.push_back({name, slice_rows(t, row, shape[0])});
    row += shape[0];
  }
}

}  // namespace

std::vector<DeepseekPiece> deepseek_pieces(const DeepseekDims& d, HfFormat f) {
  const ModelDims& m = d.m;
  const int64_t h = m.hidden;
  std::vector<DeepseekPiece> out;
  out.push_back({"embedding.word_embeddings.weight", {m.padded_vocab, h}, {{"model.embed_tokens.weight", {m.vocab, h}}}});
  for (int64_t i = 0; i < m.num_layers; ++i)
    layer_pieces(d, f, fmt::format("decoder.layers.{}.", i), fmt::format("model.layers.{}.", i), m.is_moe_layer(i), out);
  out.push_back({"decoder.final_layernorm.weight", {h}, {{"model.norm.weight", {h}}}});
  if (m.untied) out.push_back({"output_layer.weight", {m.padded_vocab, h}, {{"lm_head.weight", {m.vocab, h}}}});
  for (int64_t k = 0; k < d.mtp; ++k) {  // DeepSeek's MTP module k: decoder layer num_layers + k
    const std::string M = fmt::format("mtp.layers.{}.", k), H = fmt::format("model.layers.{}.", m.num_layers + k);
    out.push_back({M + "enorm.weight", {h}, {{H + "enorm.weight", {h}}}});
    out.push_back({M + "hnorm.weight", {h}, {{H + "hnorm.weight", {h}}}});
    out.push_back({M + "eh_proj.weight", {h, 2 * h}, {{H + "eh_proj.weight", {h, 2 * h}}}});
    // our depth's layer is of the decoder's last layer's kind, HF's (index >= first_k_dense_replace) a MoE layer
    layer_pieces(d, f, M + "transformer_layer.", H, m.is_moe_layer(m.num_layers - 1), out);
    out.push_back({M + "final_layernorm.weight", {h}, {{H + "shared_head.norm.weight", {h}}}});
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> deepseek_copies(const DeepseekDims& d) {
  std::vector<std::pair<std::string, std::string>> out;
  for (int64_t k = 0; k < d.mtp; ++k) {
    const std::string H = fmt::format("model.layers.{}.", d.m.num_layers + k);
    out.push_back({H + "embed_tokens.weight", "model.embed_tokens.weight"});
    out.push_back({H + "shared_head.head.weight", d.m.untied ? "lm_head.weight" : "model.embed_tokens.weight"});
  }
  return out;
}

std::vector<std::pair<std::string, Shape>> deepseek_param_shapes(const DeepseekDims& d) {
  std::vector<std::pair<std::string, Shape>> out;
  for (const DeepseekPiece& p : deepseek_pieces(d, HfFormat::DeepseekV3)) out.push_back({p.ours, p.shape});
  return out;
}

void export_deepseek(const CheckpointReader& r, HfFormat f, std::vector<SafetensorsItem>& items, nlohmann::json& cfg) {
  DeepseekDims d = deepseek_dims_from_config(r.meta()["config"], r.dir() + "/manifest.json meta.config");
  cfg = deepseek_hf_config(d, f);  // first: what the format cannot express fails before any tensor is read
  std::map<std::string, Tensor> by_hf;  // for the copies
  for (const DeepseekPiece& p : deepseek_pieces(d, f)) {
    Tensor t = r.read(p.ours);
    if (t.shape() != p.shape)
      fail("{}: tensor '{}' has shape {} but the config implies {}", r.dir(), p.ours, shape_str(t.shape()),
           shape_str(p.shape));
    if (t.dtype() != DType::F32) t = t.to(DType::F32);
    const size_t first = items.size();
    split_piece(p, t, items);
    for (size_t i = first; i < items.size(); ++i) by_hf[items[i].name] = items[i].tensor;
  }
  if (f == HfFormat::DeepseekV3 && !d.expert_bias)  // HF's router always has the bias: zeros choose as none
    for (int64_t i = 0; i < d.m.num_layers + d.mtp; ++i)
      if (i >= d.m.num_layers || d.m.is_moe_layer(i))
        items.push_back({fmt::format("model.layers.{}.mlp.gate.e_score_correction_bias", i), Tensor::zeros({d.m.experts})});
  for (const auto& [copy, of] : deepseek_copies(d)) items.push_back({copy, by_hf.at(of)});
}

CheckpointContents import_deepseek(const std::string& hf_dir, HfFormat f) {
  const std::string cfg_path = (fs::path(hf_dir) / "config.json").string();
  const nlohmann::json c = read_hf_json(cfg_path);
  HfTensors hf(hf_dir);
  const int64_t layers = c.contains("num_hidden_layers") && c["num_hidden_layers"].is_number_integer()
                             ? c["num_hidden_layers"].get<int64_t>() : -1;
  const bool mtp_present = layers >= 0 && hf.has(fmt::format("model.layers.{}.eh_proj.weight", layers));
  DeepseekDims d = deepseek_dims_from_hf(c, cfg_path, f, mtp_present);
  // every layer holds tensors of its own: a config describing more layers than the files hold tensors (or absurd
  // expert counts) is refused before the key list is built
  const int64_t stored = static_cast<int64_t>(hf.names().size());
  if (d.m.num_layers + d.mtp > stored || d.m.experts > (int64_t{1} << 20))
    fail("{}: fields 'num_hidden_layers' ({}) / 'n_routed_experts' ({}) describe more than the {} tensors in {}",
         cfg_path, d.m.num_layers, d.m.experts, stored, hf_dir);
  // transformers 5 writes its in-memory layout: each MoE layer's experts fused into mlp.experts.gate_up_proj
  // [E, 2F, h] (rows [gate; up]) and mlp.experts.down_proj [E, h, F]; they are read as the per-expert pieces
  std::map<std::string, Tensor> fused;
  const int64_t E = d.m.experts, F = d.m.moe_ffn, h = d.m.hidden;
  for (int64_t i = 0; i < d.m.num_layers + d.mtp; ++i) {
    const std::string H = fmt::format("model.layers.{}.mlp.experts.", i);
    if (!hf.has(H + "gate_up_proj")) continue;
    const Tensor gate_up = hf.get(H + "gate_up_proj", {E, 2 * F, h});
    const Tensor down = hf.get(H + "down_proj", {E, h, F});
    for (int64_t e = 0; e < E; ++e) {
      const Tensor gu = slice_rows(gate_up, e, 1).view({2 * F, h});
      fused[fmt::format("{}{}.gate_proj.weight", H, e)] = slice_rows(gu, 0, F);
      fused[fmt::format("{}{}.up_proj.weight", H, e)] = slice_rows(gu, F, F);
      fused[fmt::format("{}{}.down_proj.weight", H, e)] = slice_rows(down, e, 1).view({h, F});
    }
  }
  auto get = [&](const std::string& name, const Shape& shape) {
    auto it = fused.find(name);
    return it != fused.end() ? it->second : hf.get(name, shape);
  };
  CheckpointContents out;
  out.iteration = 0;
  for (const DeepseekPiece& p : deepseek_pieces(d, f)) {
    std::vector<Tensor> parts;
    int64_t rows = 0;
    for (const auto& [name, shape] : p.hf) {
      parts.push_back(get(name, shape));
      rows += shape[0];
    }
    Tensor t = parts.size() == 1 ? parts[0] : cat_rows(parts);
    out.tensors.push_back({p.ours, rows < p.shape[0] ? pad_rows(t, p.shape[0]) : t});
  }
  for (const auto& [copy, of] : deepseek_copies(d)) {  // our depths share the embedding and the output layer
    const Tensor a = hf.get(copy, {d.m.vocab, h}), b = hf.get(of, {d.m.vocab, h});
    if (std::memcmp(a.data<float>(), b.data<float>(), static_cast<size_t>(a.numel()) * sizeof(float)) != 0)
      fail("{}: tensor '{}' differs from '{}'; mcpp's MTP depths share the model's embedding and output layer",
           hf_dir, copy, of);
  }
  const bool tied = !d.m.untied;
  hf.check_all_used([tied](const std::string& n) {
    return n.find("rotary_emb.inv_freq") != std::string::npos || (tied && n == "lm_head.weight");
  });
  out.meta = {{"config", config_from_deepseek_dims(d)},
              {"imported_from", {{"format", hf_format_name(f)}, {"path", fs::absolute(hf_dir).string()}}}};
  return out;
}

}  // namespace mcpp::dist_checkpointing
