// SequentialMLP (Megatron-Core transformer/moe/experts.py): this EP rank's local experts, each an MLP
// (transformer/mlp.h: fc1 -> GELU / SwiGLU -> fc2, moe_ffn_hidden_size wide) run one after the other on its
// contiguous rows of the dispatcher's expert-grouped buffer [rows, h]. Parameters are named with the GLOBAL
// expert index, as Megatron's sharded state dict names them:
//   <prefix>.local_experts.<first_local_expert + j>.linear_fc1.weight / .linear_fc2.weight (+ biases)
// so a checkpoint holds every expert once whatever the EP layout. An expert that gets no rows does no work; in
// backward its main grads are materialized (zero, or left as accumulated) and reported ready.
// Expert tensor parallelism (expert_tp of size etp): each expert's fc1 rows / fc2 columns split over it (its
// TensorShards over expert-TP, so checkpoints stay layout-free); x is then the rows of every expert-TP rank
// (the dispatcher's all-gather), the output and dx partial sums the dispatcher reduce-scatters.
#pragma once
#include <string>
#include <vector>

#include "mcpp/tensor_parallel/tp_context.h"
#include "mcpp/transformer/mlp.h"

namespace mcpp::moe {

struct ExpertsCtx {
  Tensor x;                      // [rows, h] the grouped input (the experts' fc1 inputs are views of it)
  std::vector<MLPCtx> mlp;       // per local expert
  std::vector<int64_t> rows;     // rows per local expert in this forward
  // GroupedMLP (grouped_mlp.h): the rows per local expert (int64 [El] on x's device), fc1's output [rows, f or 2f]
  // (per expert-TP rank) and the activation [rows, f] (fc2's input; dropped under recompute "moe_act")
  Tensor counts, pre_act, act;
};

class SequentialMLP {
 public:
  // config: the layer's (moe_ffn_hidden_size is used as the experts' ffn size); expert_tp: the expert-TP group.
  SequentialMLP(ParameterRegistry& params, const std::string& prefix, const TransformerConfig& config,
                const tensor_parallel::TPContext& expert_tp, int64_t first_expert, int64_t num_local_experts);
  // x [rows, h] grouped by local expert (rows[j] rows each) -> [rows, h].
  Tensor forward(ExpertsCtx& ctx, const Tensor& x, const std::vector<int64_t>& rows) const;
  Tensor backward(ExpertsCtx& ctx, const Tensor& dy) const;
  int64_t num_local_experts() const { return static_cast<int64_t>(experts_.size()); }
  // Local expert j's parameters in registration order (fc1 weight [, bias], fc2 weight [, bias]): GroupedMLP's.
  const std::vector<Parameter*>& params(int64_t j) const { return params_[static_cast<size_t>(j)]; }

 private:
  std::vector<MLP> experts_;
  std::vector<std::vector<Parameter*>> params_;  // each expert's parameters
};

}  // namespace mcpp::moe
