// MoEAlltoAllTokenDispatcher (Megatron-Core transformer/moe/token_dispatcher.py, the "alltoall" dispatcher):
// moves each route (token t, choice i) of this rank's [n, h] tokens to the rank holding its expert and back.
// Experts are split evenly over the EP group: EP rank r holds experts [r * El, (r + 1) * El), El = E / ep.
//   plan():    from the router's idx (each route's row in the local expert-major buffer [n*k, h]: experts in
//              order, each expert's tokens in token order — Megatron's permute) and its per-expert counts, which
//              are all-gathered over EP (host) to size the all-to-all: send_rows[r] = rows for r's experts,
//              recv_rows[r] = rows rank r sends here, recv_chunk[r * El + e] = of those, for local expert e.
//              uniform (the buffer padded to capacity: every expert's block is the capacity on every EP rank, whose
//              token counts are equal): no all-gather — every rank's counts are these.
//   to_experts():   [n*k, h] expert-major rows -> all-to-all over EP -> [rows, h] grouped by local expert
//                   (Megatron's sort_chunks_by_idxs: received [src rank][local expert] -> [local expert][src]).
//   from_experts(): the inverse (regroup, reverse all-to-all) -> [n*k, h] in this rank's expert-major order.
// Both are collectives over EP (blocking all-to-alls); at EP 1 they return their input. The same two
// calls move gradients in backward (to_experts carries the combine's row gradients, from_experts the experts'
// input gradients). The combine weights and the permute / unpermute themselves: ops::moe_* (moe_layer.cpp).
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
  std::vector<int64_t> send_rows, recv_rows;    // [ep]
  std::vector<int64_t> recv_chunk;              // [ep * El]: rows from rank r for local expert e at r * El + e
  std::vector<int64_t> tokens_per_local_expert;  // [El] rows each local expert processes
};

class MoEAlltoAllTokenDispatcher {
 public:
  // ep: the expert-parallel group (null = EP 1); num_experts % ep == 0.
  MoEAlltoAllTokenDispatcher(int64_t num_experts, comm::CommPtr ep);
  // idx [n, k] int32 (the tokens' device), counts [E] this rank's buffer rows per expert. Collective over EP
  // unless uniform.
  DispatchPlan plan(const Tensor& idx, const std::vector<int64_t>& counts, int64_t n, int64_t k,
                    bool uniform = false) const;
  Tensor to_experts(const DispatchPlan& p, const Tensor& rows) const;      // [rows, h] -> [sum El rows, h]
  Tensor from_experts(const DispatchPlan& p, const Tensor& grouped) const;  // inverse
  int ep_size() const { return ep_ ? ep_->size() : 1; }
  int ep_rank() const { return ep_ ? ep_->rank() : 0; }
  int64_t num_local_experts() const { return experts_ / ep_size(); }
  int64_t first_local_expert() const { return ep_rank() * num_local_experts(); }

 private:
  int64_t experts_;
  comm::CommPtr ep_;
};

}  // namespace mcpp::moe
