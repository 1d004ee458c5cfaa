#include "mcpp/transformer/spec.h"

#include <fmt/ranges.h>

#include "mcpp/core/error.h"

namespace mcpp {

std::map<std::string, CoreAttentionFactory>& core_attention_registry() {
  static std::map<std::string, CoreAttentionFactory> registry = {
      {"flash", &make_flash_attention},
      {"unfused", &make_unfused_attention},
  };
  return registry;
}

std::vector<std::string> core_attention_names() {
  std::vector<std::string> names;
  for (const auto& [name, _] : core_attention_registry()) names.push_back(name);
  return names;
}

TransformerLayerSpec get_gpt_layer_local_spec(const TransformerConfig& config) {
  auto& reg = core_attention_registry();
  auto it = reg.find(config.attention_impl);
  if (it == reg.end())
    fail("attention_impl: unknown core attention '{}' (registered: {})", config.attention_impl,
         fmt::join(core_attention_names(), ", "));
  return {.core_attention = it->first, .make_core_attention = it->second};
}

}  // namespace mcpp
