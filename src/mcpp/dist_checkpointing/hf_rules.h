// The HF converters' key mapping: one rule table per HF format (our key pattern -> HF name patterns + the transform),
// and the engine that maps a model's OWN tensor list (models/gpt/gpt_model_tensors.h: what GPTModel registers, plus
// the routers' expert-bias buffers) through it, for export (hf_convert.cpp, hf_deepseek.cpp) and import (hf_import.cpp,
// hf_deepseek.cpp). A parameter a module adds is mapped by one new row here — or refused by name, never skipped.
//
// Contract. A rule's patterns name decimal key segments: {i} a decoder layer, {e} an expert, {k} an MTP depth, and on
// the HF side {m} = num_layers + k (DeepSeek's MTP depth k is its HF layer num_layers + k). hf_pieces maps each of our
// tensors, in the list's order; a key that no rule of the format matches is an mcpp::Error
//   no HF name for parameter '<key>' (<format>)
// (the CLI: one `error:` line, exit 2). The transforms (HfOp) are exact row rearrangements, bit-identical both ways,
// except the vocabulary's: export drops the padding rows, import appends zero rows. A rule's `fused` pattern is
// transformers 5's own layout of that tensor, read on import when the file holds it (each MoE layer's experts fused:
// mlp.experts.gate_up_proj [E, 2F, h] = every expert's fc1 [gate; up], mlp.experts.down_proj [E, h, F]; an expert's
// tensor is row {e} of it; Mixtral's router at mlp.gate).
//
// Tensors are CPU F32. Export reads a checkpoint tensor through export_pieces, which checks its shape against the
// model's ("tensor '<key>' has shape ... but the config implies ..."); import reads HF tensors through HfTensors::get,
// which checks theirs ("... but config.json implies ...").
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "mcpp/core/tensor.h"
#include "mcpp/dist_checkpointing/checkpoint.h"
#include "mcpp/dist_checkpointing/hf_convert.h"
#include "mcpp/dist_checkpointing/hf_tensors.h"
#include "mcpp/dist_checkpointing/safetensors.h"

namespace mcpp::dist_checkpointing {

// How our tensor relates to its HF tensors (ours -> HF on export; the inverse on import).
enum class HfOp {
  Same,       // one HF tensor, equal
  Vocab,      // one HF tensor: our first `vocab` rows (the padding rows: dropped on export, zeros on import)
  Transpose,  // one HF tensor: ours transposed (GPT-2's Conv1D weights, stored [in, out])
  Rows,       // n HF tensors: ours cut into n equal row blocks (SwiGLU's fc1 [gate; up] -> gate_proj, up_proj)
  Qkv,        // q, k, v: Megatron's grouped QKV rows split per query group (hf_tensor_ops.h split_qkv)
  QkvCat,     // one HF tensor [q; k; v] (GPT-2's c_attn bias)
  QkvCatT,    // one HF tensor [q; k; v] transposed (GPT-2's c_attn weight)
};

struct HfRule {
  std::string ours;             // "decoder.layers.{i}.mlp.linear_fc1.weight"
  HfOp op = HfOp::Same;
  std::vector<std::string> hf;  // "model.layers.{i}.mlp.gate_proj.weight", "model.layers.{i}.mlp.up_proj.weight"
  std::string fused = {};       // import: transformers 5's tensor holding it (empty: none)
};
// The format's rules (built once).
const std::vector<HfRule>& hf_rules(HfFormat f);

// The numbers the patterns and transforms need.
struct HfLayout {
  int64_t num_layers = 0;  // {m} = num_layers + k
  int64_t vocab = 0;       // the HF vocabulary (ours padded)
  int64_t heads = 0, groups = 0, head_dim = 0;  // Megatron's grouped QKV
  int64_t experts = 0;     // a fused experts tensor's first dim
};
HfLayout hf_layout(const ModelDims& d);

// One of our tensors and the HF tensors it is.
struct HfPiece {
  std::string ours;
  Shape shape;
  HfOp op = HfOp::Same;
  std::vector<std::pair<std::string, Shape>> hf;
  std::string fused;  // transformers 5's tensor (import, when the file holds it), of shape fused_shape
  Shape fused_shape;
  int64_t expert = -1;  // the row of `fused` that is ours (-1: the whole tensor)
};
std::vector<HfPiece> hf_pieces(const std::vector<std::pair<std::string, Shape>>& ours, HfFormat f,
                               const HfLayout& l);

// Our tensors of a model, from its meta.config (Config::to_json's {"model": {...}}; errors name "model.<field>"): the
// model's own list (gpt_model_tensors).
std::vector<std::pair<std::string, Shape>> model_tensors_from_config(const nlohmann::json& config);

// Export: every piece's checkpoint tensor, shape-checked, as HF tensors appended to `items` in piece order.
void export_pieces(const CheckpointReader& r, const std::vector<HfPiece>& pieces, const HfLayout& l,
                   std::vector<SafetensorsItem>& items);
// Import: every piece from the HF tensors, in piece order; drop_prefix is cut from the HF names that begin with it
// (GPT-2's original files have no "transformer.").
std::vector<NamedTensor> import_pieces(hf_detail::HfTensors& hf, const std::vector<HfPiece>& pieces,
                                       const HfLayout& l, const std::string& drop_prefix = "");

}  // namespace mcpp::dist_checkpointing
