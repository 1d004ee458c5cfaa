// Tensor-parallel communication mappings (Megatron-Core tensor_parallel/mappings.py), as named pairs.
// Activations are [s, b, h] with the sequence on dim 0, so a sequence-parallel shard is a contiguous
// block of rows and all-gather / reduce-scatter along dim 0 are the flat collectives.
//   copy_to_tp            fwd identity                       bwd all-reduce over TP    (reduce_from_tp_bwd)
//   reduce_from_tp        fwd all-reduce over TP             bwd identity
//   gather_from_sp        fwd all-gather [s/tp] -> [s]       bwd reduce-scatter [s] -> [s/tp]
//   reduce_scatter_to_sp  fwd reduce-scatter [s] -> [s/tp]   bwd all-gather
//   scatter_to_sp         fwd keep own chunk [s] -> [s/tp]   bwd all-gather
//   gather_from_tp        fwd all-gather the last dim [.., h/tp] -> [.., h]   bwd keep own last-dim block
// Each function below is one direction of one pair; the caller pairs them in forward and backward.
// All are blocking (Work waited) on the TP communicator unless named _async; with tp == 1 they are
// identities.
#pragma once
#include <functional>

#include "mcpp/comm/communicator.h"
#include "mcpp/core/tensor.h"

namespace mcpp::tensor_parallel {

// All-reduce (sum) in place over TP: reduce_from_tp forward, copy_to_tp backward.
void all_reduce_tp(comm::Communicator& tp, Tensor& x);
// [s/tp, ...] -> [s, ...]: gather_from_sp forward, reduce_scatter_to_sp / scatter_to_sp backward.
Tensor all_gather_sp(comm::Communicator& tp, const Tensor& x);
// [s, ...] -> [s/tp, ...] summed over TP: reduce_scatter_to_sp forward, gather_from_sp backward.
Tensor reduce_scatter_sp(comm::Communicator& tp, const Tensor& x);
// [s, ...] -> this rank's [s/tp, ...] rows (a view, no communication): scatter_to_sp forward.
Tensor split_sp(comm::Communicator& tp, const Tensor& x);

// [..., h/tp] -> [..., h], rank r's block at columns [r h/tp, (r+1) h/tp): gather_from_tp forward (Megatron's
// gather_from_tensor_model_parallel_region, e.g. after the MTP's eh_proj).
Tensor all_gather_last_dim(comm::Communicator& tp, const Tensor& x);
// [..., h] -> this rank's [..., h/tp] block of the last dim (a copy): gather_from_tp backward.
Tensor split_last_dim(comm::Communicator& tp, const Tensor& x);

// The asynchronous forms (tp > 1): the collective is posted and the caller waits `work` later — Megatron's
// LinearWithGradAccumulationAndAsyncCommunication overlaps the input-grad reduction with the wgrad GEMM
// this way. `out` is valid after work.wait() (all-reduce: x itself, in place).
struct AsyncResult {
  Tensor out;
  comm::Work work;
};
AsyncResult all_reduce_tp_async(comm::Communicator& tp, Tensor& x);
AsyncResult reduce_scatter_sp_async(comm::Communicator& tp, const Tensor& x);

// gather_from_sp forward as a ring (--tp-comm-overlap, Transformer Engine's ring-exchange all-gather):
// [s/tp, ...] -> [s, ...] in tp steps; at step k this rank holds chunk c = (rank - k) mod tp, hands it to
// on_chunk(c, chunk) — the caller's GEMM on those rows — while it sends c to the next rank and receives
// c - 1 from the previous one (one batched P2P per step on the TP group). Every chunk reaches on_chunk
// exactly once, in that order; the returned tensor is the all-gather's result. tp == 1: on_chunk(0, x).
Tensor all_gather_sp_ring(comm::Communicator& tp, const Tensor& x,
                          const std::function<void(int chunk, const Tensor& rows)>& on_chunk);
// reduce_scatter_to_sp forward as a ring (--tp-comm-overlap): this rank's rows chunk of the sum over TP of
// every rank's [s, ...] partial, without forming the partial whole. partial(c, out) writes this rank's
// partial of chunk c into out (chunk_shape); at step k it is called for chunk c = (rank - k - 1) mod tp
// while the running sum of the previous step travels to the next rank, then the sum received from the
// previous rank is added; after tp steps the sum of chunk `rank` is complete. tp == 1: partial(0, out).
Tensor reduce_scatter_sp_ring(comm::Communicator& tp, const Shape& chunk_shape, DType dtype, Device device,
                              const std::function<void(int chunk, Tensor& out)>& partial);

// Context parallelism, all-to-all form (Megatron's --cp-comm-type a2a, DeepSpeed-Ulysses): each CP rank
// holds a contiguous sequence chunk of s / cp rows; around the core attention two all-to-alls over the CP
// group trade sequence for heads, so the attention runs on the WHOLE sequence for 1 / cp of the heads.
//   all_to_all_cp2hp  [s/cp, b, cp*m] (this rank's rows, every head block) -> [s, b, m] (all rows, head block
//                     `cp rank`); rows of CP rank j are rows [j*s/cp, (j+1)*s/cp) of the result
//   all_to_all_hp2cp  its inverse (and each one's backward is the other)
// The last dim splits into cp equal contiguous blocks: whole query groups of the fused qkv rows, whole heads of
// the context. cp == 1: identities.
Tensor all_to_all_cp2hp(comm::Communicator& cp, const Tensor& x);
Tensor all_to_all_hp2cp(comm::Communicator& cp, const Tensor& x);

}  // namespace mcpp::tensor_parallel
