// MoEAlltoAllTokenDispatcher (Megatron-Core transformer/moe/token_dispatcher.py, the "alltoall" dispatcher):
// moves each route (token t, choice i) of this rank's [n, h] tokens to the ranks holding its expert and back.
// Experts are split evenly over the EP group: EP rank r holds experts [r * El, (r + 1) * El), El = E / ep; under
// expert tensor parallelism (etp > 1) the etp ranks of an expert-TP group hold the same experts, each a shard.
//   plan():    from the router's idx (each route's row in the local expert-major buffer [n*k, h]: experts in
//              order, each expert's tokens in token order — Megatron's permute) and its per-expert counts, which
//              are all-gathered (host) over EP and then expert-TP to size the collectives: send_rows[r] = rows for
//              EP rank r's experts, recv_rows[r] = rows EP rank r sends here, etp_rows[q] = rows expert-TP rank q
//              received so, recv_chunk[(q * ep + r) * El + e] = of those, from EP rank r for local expert e.
//              uniform (the buffer padded to capacity: every expert's block is the capacity on every rank, whose
//              token counts are equal): no all-gather — every rank's counts are these.
//   to_experts():   [n*k, h] expert-major rows -> all-to-all over EP -> all-gather over expert-TP (Megatron's
//                   gather_from_sequence_parallel_region with output_split_sizes: each rank's block padded to the
//                   largest, then one all_gather) -> [rows, h] grouped by local expert (sort_chunks_by_idxs:
//                   [etp rank][EP rank][local expert] -> [local expert][etp rank][EP rank]).
//   from_experts(): the inverse: regroup, reduce-scatter over expert-TP (the experts' partial outputs summed;
//                   each rank keeps its own rows), reverse all-to-all -> [n*k, h] in this rank's expert-major order.
// Collectives over EP / expert-TP (blocking); at EP 1 and expert-TP 1 both return their input. The same two calls
// move gradients in backward (to_experts carries the combine's row gradients — the all-gather is the
// reduce-scatter's backward —, from_experts the experts' partial input gradients). The combine weights and the
// permute / unpermute themselves: ops::moe_* (moe_layer.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "mcpp/comm/communicator.h"
#include "mcpp/core/tensor.h"

namespace mcpp::moe {

struct DispatchPlan {
  int64_t n = 0, k = 0;
  int64_t rows = 0;                             // this rank's expert-major buffer rows (the counts' sum)
  Tensor idx;                                   // [n, k] int32 on the tokens' device (-1: a dropped route)
  std::vector<int64_t> send_rows, recv_rows;    // [ep]: the EP all-to-all's
  std::vector<int64_t> etp_rows;                // [etp]: rows each expert-TP rank received over EP
  std::vector<int64_t> recv_chunk;              // [etp * ep * El]: see the header
  std::vector<int64_t> tokens_per_local_expert;  // [El] rows each local expert processes
};

class MoEAlltoAllTokenDispatcher {
 public:
  // ep / etp: the expert-parallel and expert-tensor-parallel groups (null = size 1); num_experts % ep == 0.
  MoEAlltoAllTokenDispatcher(int64_t num_experts, comm::CommPtr ep, comm::CommPtr etp = nullptr);
  // idx [n, k] int32 (the tokens' device), counts [E] this rank's buffer rows per expert. Collective over EP and
  // expert-TP unless uniform.
  DispatchPlan plan(const Tensor& idx, const std::vector<int64_t>& counts, int64_t n, int64_t k,
                    bool uniform = false) const;
  // EP 1 and expert-TP 1, dropless, the per-expert counts left on the device (GroupedMLP): every route is a row
  // (rows = n * k); tokens_per_local_expert stays empty. No collective, no host read.
  DispatchPlan plan_local(const Tensor& idx, int64_t n, int64_t k) const;
  Tensor to_experts(const DispatchPlan& p, const Tensor& rows) const;      // [rows, h] -> [sum El rows, h]
  Tensor from_experts(const DispatchPlan& p, const Tensor& grouped) const;  // inverse
  int ep_size() const { return ep_ ? ep_->size() : 1; }
  int ep_rank() const { return ep_ ? ep_->rank() : 0; }
  int etp_size() const { return etp_ ? etp_->size() : 1; }
  int etp_rank() const { return etp_ ? etp_->rank() : 0; }
  int64_t num_local_experts() const { return experts_ / ep_size(); }
  int64_t first_local_expert() const { return ep_rank() * num_local_experts(); }

 private:
  int64_t experts_;
  comm::CommPtr ep_, etp_;
};

}  // namespace mcpp::moe
