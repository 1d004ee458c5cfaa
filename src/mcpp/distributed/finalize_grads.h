// finalize_model_grads (Megatron-Core distributed/finalize_model_grads.py), run after the backward passes
// of all microbatches and before the optimizer:
//   1. sequence-parallel params (norm weights/biases applied to [s/tp] shards): all-reduce their partial
//      grads over TP, so every TP rank holds the full gradient.
//   2. pipeline parallel with tied embeddings (or MTP depths): all-reduce the word-embedding grad over the embedding
//      group (first stage's embedding + last stage's copy).
//   (DP gradient reduction is DistributedDataParallel's — distributed/data_parallel.h.)
// model_grad_norm: the global L2 norm of all main grads, each parameter counted once: TP-partitioned params
// on every TP rank, replicated ones on TP rank 0 only (Megatron's param_is_not_tensor_parallel_duplicate),
// summed over the model-parallel group (TP x PP).
#pragma once
#include <vector>

#include "mcpp/distributed/param_and_grad_buffer.h"
#include "mcpp/parallel_state/parallel_context.h"

namespace mcpp {

// tied_embeddings: the last stage holds a copy of the word embeddings — the model shares them with the output layer
// (not --untie-...), or its MTP depths embed with them (--mtp-num-layers); every rank of the embedding group holds the
// parameter then.
void finalize_model_grads(ParamAndGradBuffer& params, const parallel_state::ParallelContext& pc,
                          bool tied_embeddings);
// The same over this rank's model chunks (virtual pipeline stages): the word embeddings live in exactly one.
void finalize_model_grads(const std::vector<ParamAndGradBuffer*>& chunks, const parallel_state::ParallelContext& pc,
                          bool tied_embeddings);
// Its two steps apart (Megatron times them as layernorm-grads-all-reduce and embedding-grads-all-reduce): 1. (after
// zeroing the stale grads of params no backward wrote) and 2.
void allreduce_sequence_parallel_grads(const std::vector<ParamAndGradBuffer*>& chunks,
                                       const parallel_state::ParallelContext& pc);
void allreduce_embedding_grads(const std::vector<ParamAndGradBuffer*>& chunks,
                               const parallel_state::ParallelContext& pc, bool tied_embeddings);

double model_grad_norm(ParamAndGradBuffer& params, const parallel_state::ParallelContext& pc);
double model_grad_norm(const std::vector<ParamAndGradBuffer*>& chunks, const parallel_state::ParallelContext& pc);
// With expert parameters (moe/; their own buffers, expert_chunks): each expert's squares once — summed over the EP
// group (its expert-DP replicas hold the same reduced grads; expert tensor parallelism is 1), then over PP.
// Collective over EP and PP: every rank of a MoE model calls it, also one whose stage has no MoE layer (no
// expert_chunks, --moe-layer-freq).
double model_grad_norm(const std::vector<ParamAndGradBuffer*>& chunks,
                       const std::vector<ParamAndGradBuffer*>& expert_chunks,
                       const parallel_state::ParallelContext& pc);

// Megatron's clip coefficient: max_norm / (total_norm + 1e-6) when that is < 1, else 1 (also for
// max_norm <= 0 or a non-finite norm). The trainer passes it to the optimizer step (folded into AdamW).
double clip_coefficient(double total_norm, double max_norm);
// Megatron's clip_grad_by_total_norm_fp32 on the whole grad buffer: scale by clip_coefficient when it is
// < 1. Returns the coefficient applied (1 when none).
double clip_grads_by_total_norm(ParamAndGradBuffer& params, double total_norm, double max_norm);

}  // namespace mcpp
