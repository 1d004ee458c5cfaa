// The tensors of a Hugging Face model directory, read by name for the HF importers (hf_import.cpp, hf_deepseek.cpp),
// and the config.json field readers they share.
//
// Contract. HfTensors opens <dir>/model.safetensors, or the shards named by <dir>/model.safetensors.index.json
// (weight_map values are plain file names in <dir>); get() returns one tensor as CPU F32 (stored F32, F16 or BF16)
// after checking its shape, and records it as used; check_all_used() then fails naming the first stored tensor that
// was neither read nor ignorable — an import never drops a tensor silently. The cfg_* readers fail naming the field
// and the file: cfg_int wants a positive integer; cfg_num / cfg_bool / cfg_str return the default when the field is
// absent or null. Every failure is an mcpp::Error (one `error:` line, exit 2 in the CLI).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "mcpp/core/tensor.h"
#include "mcpp/dist_checkpointing/safetensors.h"

namespace mcpp::dist_checkpointing::hf_detail {

nlohmann::json read_hf_json(const std::string& path);  // a JSON object of at most 64 MiB

class HfTensors {
 public:
  explicit HfTensors(const std::string& dir);
  bool has(const std::string& name) const { return where_.count(name) > 0; }
  std::vector<std::string> names() const;
  Tensor get(const std::string& name, const Shape& shape);  // CPU F32, shape checked; marks it used
  void check_all_used(const std::function<bool(const std::string&)>& ignorable) const;
  // Refuses a config.json (`fields` names its counts) that describes more than the files can hold — every layer has
  // tensors of its own, every expert of a MoE layer values of its own — before the model's key list is built.
  void require_room(int64_t layers, int64_t moe_layers, int64_t experts, const std::string& fields,
                    const std::string& cfg_path) const;

 private:
  std::vector<SafetensorsHeader> headers_;
  std::map<std::string, std::pair<size_t, const SafetensorsEntry*>> where_;
  std::set<std::string> used_;
};

int64_t cfg_int(const nlohmann::json& c, const char* name, const std::string& path);
double cfg_num(const nlohmann::json& c, const char* name, const std::string& path, double dflt);
bool cfg_bool(const nlohmann::json& c, const char* name, const std::string& path, bool dflt);
std::string cfg_str(const nlohmann::json& c, const char* name, const std::string& path, const char* dflt);
inline bool cfg_has(const nlohmann::json& c, const char* name) { return c.contains(name) && !c[name].is_null(); }
inline int64_t padded_vocab(int64_t v) { return (v + 127) / 128 * 128; }  // make_vocab_size_divisible_by 128

}  // namespace mcpp::dist_checkpointing::hf_detail
