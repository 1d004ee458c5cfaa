// DeepSeek-V2 / V3 tensors: export and import through the model's own tensor list and the format's rules (hf_rules.h),
// with what HF holds beyond them (the MTP depths' copies, V3's zero router biases); see hf_deepseek.h.
#include "mcpp/dist_checkpointing/hf_deepseek.h"

#include <cstring>
#include <filesystem>
#include <map>

#include "mcpp/core/error.h"
#include "mcpp/dist_checkpointing/hf_rules.h"
#include "mcpp/dist_checkpointing/hf_tensors.h"

namespace fs = std::filesystem;

namespace mcpp::dist_checkpointing {
using namespace hf_detail;

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
  return model_tensors_from_config(config_from_deepseek_dims(d));
}

void export_deepseek(const CheckpointReader& r, HfFormat f, std::vector<SafetensorsItem>& items, nlohmann::json& cfg) {
  DeepseekDims d = deepseek_dims_from_config(r.meta()["config"], r.dir() + "/manifest.json meta.config");
  cfg = deepseek_hf_config(d, f);  // first: what the format cannot express fails before any tensor is read
  const HfLayout l = hf_layout(d.m);
  const size_t first = items.size();
  export_pieces(r, hf_pieces(model_tensors_from_config(r.meta()["config"]), f, l), l, items);
  std::map<std::string, Tensor> by_hf;  // for the copies
  for (size_t i = first; i < items.size(); ++i) by_hf[items[i].name] = items[i].tensor;
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
  int64_t moe_layers = d.mtp;  // every MTP depth's layer routes
  for (int64_t i = 0; i < d.m.num_layers; ++i) moe_layers += d.m.is_moe_layer(i) ? 1 : 0;
  hf.require_room(d.m.num_layers + d.mtp, moe_layers, d.m.experts, "'num_hidden_layers' / 'n_routed_experts'", cfg_path);
  // (transformers 5's fused experts: the rules' fused tensors, hf_rules.h)
  const HfLayout l = hf_layout(d.m);
  const int64_t h = d.m.hidden;
  CheckpointContents out;
  out.iteration = 0;
  out.tensors = import_pieces(hf, hf_pieces(deepseek_param_shapes(d), f, l), l);
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
