// GroupedMLP (Megatron-Core transformer/moe/experts.py GroupedMLP, --moe-grouped-gemm): this EP rank's local experts
// run as one grouped GEMM per linear over the dispatcher's expert-grouped buffer [rows, h] instead of one GEMM per
// expert (SequentialMLP, experts.h):
//   x [rows, h] -> ops::grouped_linear_fwd with every expert's fc1 -> pre_act [rows, f or 2f] (per expert-TP rank)
//   -> GELU / SwiGLU -> act [rows, f] -> ops::grouped_linear_fwd with every fc2 -> [rows, h]
// backward: fc2's dgrad and wgrad (+ bias grads), the activation's backward, fc1's dgrad and wgrad — five grouped
// launches plus the activation, whatever the number of experts. GELU rides in fc1's forward GEMM and gelu' in fc2's
// dgrad (ops::grouped_linear_gelu_fwd / grouped_linear_dgelu_bwd: cuBLASLt epilogues with host counts under
// MCPP_GROUPED_GEMM_EPILOGUES=1, grouped_gemm_lt.cpp), as in SequentialMLP's linear_gelu_fwd / linear_dgelu_bwd.
// counts (int64 [El]: rows per local expert, in order, summing to rows) on x's device are read on the device only, so a dropless layer at EP 1 needs no host read of the
// router's counts (moe_layer.h) and runs under CUDA graphs; on the host (a layer padded to capacity or dropping over
// it, EP > 1: the dispatcher's plan) the CUDA ops run cuBLASLt, one batched GEMM per linear when every expert has the
// same rows (padded), else one GEMM per expert (ops.inc).
// The parameters are SequentialMLP's (the same keys, shards and init: checkpoints and results are interchangeable);
// their grads accumulate into main_grad (overwritten when every grad of one grouped GEMM is stale: an expert without
// rows then gets zero grads), each reported ready in SequentialMLP's order. fc2's bias is added on expert-TP rank 0
// only (RowParallelLinear's expert rule; the dispatcher reduces). No collective runs here.
// On CPU the grouped ops loop over the experts with the per-expert GEMMs: bitwise SequentialMLP's results.
#pragma once
#include <vector>

#include "mcpp/transformer/moe/experts.h"

namespace mcpp::moe {

class GroupedMLP {
 public:
  // experts: the registered experts (their parameters); config: the layer's; etp_rank: this rank in expert-TP.
  GroupedMLP(const SequentialMLP& experts, const TransformerConfig& config, int etp_rank);
  // x [rows, h] grouped by local expert, counts int64 [El] on x's device or the host -> [rows, h].
  Tensor forward(ExpertsCtx& ctx, const Tensor& x, const Tensor& counts) const;
  Tensor backward(ExpertsCtx& ctx, const Tensor& dy) const;

 private:
  struct Linear {  // one linear of every local expert
    std::vector<Parameter*> weight, bias;  // [El] each; bias empty without add_bias_linear
    std::vector<Tensor> weights() const;
    std::vector<Tensor> biases() const;
  };
  // Backward of one grouped linear: dx = dy @ W_e per expert rows (when dx is non-null), the weight (and bias) grads.
  void linear_backward(const Linear& l, Tensor* dx, const Tensor& dy, const Tensor& x, const Tensor& counts) const;
  bool swiglu_, recompute_act_;
  bool fc2_bias_;  // fc2's bias added here (expert-TP rank 0)
  Linear fc1_, fc2_;
};

}  // namespace mcpp::moe
