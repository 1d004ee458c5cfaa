// ModuleSpec (Megatron-Core's ModuleSpec / get_gpt_layer_local_spec): the transformer layer is assembled
// from named submodule implementations chosen by config, looked up in registries. Adding an
// implementation = registering a factory under a new name; the layer code does not change.
//   core_attention: "flash" (blockwise, default) | "unfused" (Megatron's DotProductAttention)
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mcpp/transformer/dot_product_attention.h"
#include "mcpp/transformer/transformer_config.h"

namespace mcpp {

using CoreAttentionFactory = std::function<std::unique_ptr<CoreAttention>(const CoreAttentionOptions&)>;

// name -> factory; built-in entries are registered on first use.
std::map<std::string, CoreAttentionFactory>& core_attention_registry();
std::vector<std::string> core_attention_names();

struct TransformerLayerSpec {
  std::string core_attention = "flash";
  CoreAttentionFactory make_core_attention;
};

// The spec for config.attention_impl; an unknown name -> mcpp::Error listing the registered ones.
TransformerLayerSpec get_gpt_layer_local_spec(const TransformerConfig& config);

}  // namespace mcpp
