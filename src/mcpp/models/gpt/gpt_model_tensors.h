// The tensors a GPTModel of a config holds, by checkpoint key and logical shape, without building the model's
// storage: the model's own parameter list, for the code that maps a checkpoint onto another layout
// (dist_checkpointing/hf_rules.h: every key is mapped by one rule table, so a parameter a module adds is mapped or
// named as unmapped — never dropped by a hand-written key list that did not know it).
//
// Contract. gpt_model_tensors(config) builds the whole model (one pipeline stage, TP 1, CPU) on a ParameterRegistry
// that records what the modules register and allocates nothing, and returns, in registration order, each parameter's
// key and logical (unsharded) shape — the experts' parameters where their layer registers them (one registry serves
// as the dense and the expert one) — with each router's expert-bias buffer (moe_router_enable_expert_bias, a
// checkpointed non-parameter [E]) right after that router's weight. Tied output weights and MTP depths' shared
// embeddings appear once, as a checkpoint holds them. The config is finalized on a copy; the fields that shape no
// parameter but make the model build tables or per-rank state — the RoPE tables' length (seq_length, and
// max_position_embeddings without learned positions) and FP8's scaling state — are neutralized on that copy, so a
// long-context config costs only its parameter list.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "mcpp/core/tensor.h"
#include "mcpp/transformer/transformer_config.h"

namespace mcpp {

std::vector<std::pair<std::string, Shape>> gpt_model_tensors(const TransformerConfig& config);

}  // namespace mcpp
