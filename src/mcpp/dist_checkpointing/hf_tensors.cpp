// HfTensors and the config.json field readers; see hf_tensors.h.
#include "mcpp/dist_checkpointing/hf_tensors.h"

#include <filesystem>

#include "mcpp/core/error.h"
#include "mcpp/core/json_limits.h"

namespace fs = std::filesystem;

namespace mcpp::dist_checkpointing::hf_detail {

nlohmann::json read_hf_json(const std::string& path) {
  // A regular file of at most 64 MiB nesting at most kMaxJsonDepth (an HF index / config is a few KB deep 3).
  nlohmann::json j = read_json_file(path, "HF file", {.max_bytes = uint64_t{64} << 20});
  if (!j.is_object()) fail("{}: not a JSON object", path);
  return j;
}

HfTensors::HfTensors(const std::string& dir) {
  fs::path single = fs::path(dir) / "model.safetensors";
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> files;
  if (fs::exists(single)) {
    files.push_back(single.string());
  } else if (fs::exists(index)) {
    nlohmann::json j = read_hf_json(index.string());
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      fail("{}: missing object 'weight_map'", index.string());
    std::set<std::string> names;
    for (const auto& [_, f] : j["weight_map"].items()) {
      if (!f.is_string() || f.get<std::string>().find('/') != std::string::npos)
        fail("{}: weight_map values must be file names", index.string());
      names.insert(f.get<std::string>());
    }
    for (const auto& n : names) files.push_back((fs::path(dir) / n).string());
  } else {
    fail("{}: neither model.safetensors nor model.safetensors.index.json found", dir);
  }
  for (const auto& f : files) headers_.push_back(read_safetensors_header(f));
  for (size_t i = 0; i < headers_.size(); ++i)
    for (const auto& e : headers_[i].entries) where_[e.name] = {i, &e};
}

std::vector<std::string> HfTensors::names() const {
  std::vector<std::string> out;
  for (const auto& [n, _] : where_) out.push_back(n);
  return out;
}

Tensor HfTensors::get(const std::string& name, const Shape& shape) {
  auto it = where_.find(name);
  if (it == where_.end()) fail("HF checkpoint has no tensor '{}'", name);
  used_.insert(name);
  const SafetensorsHeader& h = headers_[it->second.first];
  const SafetensorsEntry& e = *it->second.second;
  if (e.shape != shape)
    fail("{}: tensor '{}' has shape {} but config.json implies {}", h.path, name, shape_str(e.shape),
         shape_str(shape));
  if (!e.dtype_known || (e.dtype != DType::F32 && e.dtype != DType::F16 && e.dtype != DType::BF16))
    fail("{}: tensor '{}' has dtype {} (expected F32, F16 or BF16)", h.path, name, e.dtype_str);
  Tensor t = read_safetensors_tensor(h, e);
  return e.dtype == DType::F32 ? t : t.to(DType::F32);
}

void HfTensors::check_all_used(const std::function<bool(const std::string&)>& ignorable) const {
  for (const auto& [n, w] : where_) {
    if (!used_.count(n) && !ignorable(n))
      fail("{}: unexpected tensor '{}' (not part of the model mcpp builds)", headers_[w.first].path, n);
  }
}

void HfTensors::require_room(int64_t layers, int64_t moe_layers, int64_t experts, const std::string& fields,
                             const std::string& cfg_path) const {
  const auto tensors = static_cast<int64_t>(where_.size());
  long double values = 0;  // stored values; the header checks bounded each tensor by its file's size
  for (const auto& [_, w] : where_) {
    long double n = 1;
    for (int64_t dim : w.second->shape) n *= static_cast<long double>(dim);
    values += n;
  }
  if (layers > tensors || static_cast<long double>(moe_layers) * static_cast<long double>(experts) > values)
    fail("{}: fields {} ({} layers, {} experts) describe more than the {} tensors in {} hold", cfg_path, fields, layers,
         experts, tensors, headers_.empty() ? cfg_path : headers_[0].path);
}

int64_t cfg_int(const nlohmann::json& c, const char* name, const std::string& path) {
  auto it = c.find(name);
  if (it == c.end() || !it->is_number_integer() || it->get<int64_t>() <= 0)
    fail("{}: field '{}' must be a positive integer", path, name);
  return it->get<int64_t>();
}

double cfg_num(const nlohmann::json& c, const char* name, const std::string& path, double dflt) {
  auto it = c.find(name);
  if (it == c.end() || it->is_null()) return dflt;
  if (!it->is_number()) fail("{}: field '{}' must be a number", path, name);
  return it->get<double>();
}

bool cfg_bool(const nlohmann::json& c, const char* name, const std::string& path, bool dflt) {
  auto it = c.find(name);
  if (it == c.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) fail("{}: field '{}' must be true or false", path, name);
  return it->get<bool>();
}

std::string cfg_str(const nlohmann::json& c, const char* name, const std::string& path, const char* dflt) {
  auto it = c.find(name);
  if (it == c.end() || it->is_null()) return dflt;
  if (!it->is_string()) fail("{}: field '{}' must be a string, got {}", path, name, it->dump());
  return it->get<std::string>();
}

}  // namespace mcpp::dist_checkpointing::hf_detail
