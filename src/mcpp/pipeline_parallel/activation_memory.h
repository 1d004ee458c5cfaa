// Activation memory held by per-microbatch model contexts (DESIGN decision 1: the schedule owns one
// GPTModelCtx per microbatch per chunk, so what it keeps alive is exactly what those contexts reach).
//   context_bytes(ctxs): the nbytes of the tensors reachable from the given contexts, each storage counted
//   once (a tensor saved by two modules, or several views of one buffer, count once, with the largest
//   view's nbytes — the contexts hold whole-buffer views, so this is the buffer's size). Not counted: the
//   rotary tables (views of the model's own tables, shared by every microbatch), constants, not activations.
// Covers GPTModelCtx -> TransformerBlockCtx (layers, kept recompute inputs, final norm) -> layer contexts
// (norms, self-attention incl. core attention and selective-recompute inputs, MLP or MoE: the router's input and
// softmax state, routes, probabilities, the experts' grouped input, MLP contexts and outputs) -> output layer, logits,
// labels, loss mask, lse. A field added to one of those contexts must be added to the visitor here.
#pragma once
#include <cstddef>
#include <vector>

#include "mcpp/models/gpt/gpt_model.h"

namespace mcpp::pipeline_parallel {

size_t context_bytes(const std::vector<const GPTModelCtx*>& ctxs);
inline size_t context_bytes(const GPTModelCtx& ctx) { return context_bytes(std::vector<const GPTModelCtx*>{&ctx}); }

}  // namespace mcpp::pipeline_parallel
