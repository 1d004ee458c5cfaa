// Global gradient-norm clipping over fp32 main grads (Megatron's get_grad_norm_fp32 +
// clip_grad_by_total_norm_fp32, and torch.nn.utils.clip_grad_norm_ for the L2 norm).
//
//   total_norm = sqrt(allreduce_sum(sum_i ops::sum_of_squares(grad_i)))   (float64 accumulation)
//   clip_coeff = max_norm / (total_norm + 1e-6);  when clip_coeff < 1: grad_i *= clip_coeff (in place)
// Returns total_norm (before clipping). A NaN/inf norm is returned as is and the grads are left
// untouched — unlike Megatron, which would scale by 0 on inf — so the caller must skip the step. max_norm <= 0 computes the
// norm without clipping (Megatron: --clip-grad 0).
//
// Distributed hook: `allreduce_sum` turns this rank's sum of squares into the sum over the ranks that
// hold disjoint pieces of the model (TP/PP, and DP shards with the distributed optimizer); the caller
// must count each parameter once (skip TP-duplicated ones). No global state: pass it explicitly —
// single-rank callers pass `identity_reduce`.
#pragma once
#include <functional>
#include <vector>

#include "mcpp/core/tensor.h"

namespace mcpp {

using SumReduceFn = std::function<double(double)>;
inline double identity_reduce(double local) { return local; }

double get_grad_norm_fp32(const std::vector<Tensor>& grads, const SumReduceFn& allreduce_sum);
double clip_grad_norm_fp32(const std::vector<Tensor>& grads, double max_norm, const SumReduceFn& allreduce_sum);

}  // namespace mcpp
