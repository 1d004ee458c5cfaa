// MLP (Megatron-Core transformer/mlp.py), tensor parallel over the FFN dim:
//   x [s(/tp), b, h] -> linear_fc1 (ColumnParallel) -> [s, b, f/tp] (GELU) or [s, b, 2f/tp] (SwiGLU: the
//   logical rows [gate; up] interleaved per TP rank so each rank holds [gate_r; up_r]) -> activation
//   -> [s, b, f/tp] -> linear_fc2 (RowParallel, init scaled by 1/sqrt(2L)) -> [s(/tp), b, h].
// Backward mirrors it; parameter grads accumulate into main_grad.
// GELU path (Transformer Engine's LayerNormMLP fusion): fc1's bias + GELU run in fc1's GEMM epilogue
// (ColumnParallelLinear::forward_gelu, which keeps pre_act), GELU' in fc2's dgrad GEMM epilogue
// (RowParallelLinear::backward_dgelu), fc1's bias grad in fc1's weight-grad GEMM (linear_bwd; on CUDA the
// BGRADB epilogue, deterministic, no pass over dpre). On CPU the
// fused ops are the unfused ones composed, so results are bitwise those of the unfused path.
// Selective recompute "moe_act" (routed experts only): the activation's output (fc2's saved input) is dropped after
// the forward and re-run from pre_act (fc1's output, kept) at the start of backward — on CPU the same bits; on CUDA
// the GELU path's activation then comes from gelu_fwd on the stored pre_act rather than fc1's GEMM epilogue.
#pragma once
#include <string>

#include "mcpp/tensor_parallel/layers.h"
#include "mcpp/tensor_parallel/tp_context.h"
#include "mcpp/transformer/activation_dims.h"
#include "mcpp/transformer/transformer_config.h"

namespace mcpp {

struct MLPCtx {
  tensor_parallel::ParallelLinearCtx fc1;
  Tensor pre_act;  // [n, f/tp] or [n, 2f/tp]
  tensor_parallel::ParallelLinearCtx fc2;
};

class MLP {
 public:
  // Saved activations of one microbatch's forward (the memory planner; activation_dims.h), for an FFN width f per
  // rank over `rows` rows: linear_fc1's input rows*h*e when `keeps_input` (the norm output, gathered under SP;
  // selective "layernorm" drops it), and GELU's pre_act + act 2*rows*f*e or SwiGLU's fc1 output + act 3*rows*f*e.
  static int64_t saved_bytes(const TransformerConfig& config, const ActivationDims& d, int64_t rows, int64_t f,
                             bool keeps_input);
  // is_expert (Megatron's MLP(is_expert=True)): a routed expert — tp is the expert-TP group, the linears run no
  // collective (ParallelLinearOptions::explicit_expert_comm; the MoE dispatcher gathers and reduces), rows in
  // [n, 1, h] without sequence parallelism. fp8: the linears' FP8 GEMMs (a dense layer's: its spec's linear_fp8,
  // transformer/spec.h; disabled for routed experts).
  MLP(ParameterRegistry& params, const std::string& prefix, const TransformerConfig& config,
      const tensor_parallel::TPContext& tp, const tensor_parallel::Fp8Options& fp8, bool is_expert = false);
  // fp8_recompute: the FP8 linears under activation recompute (tensor_parallel/fp8_recompute.h; null: plain).
  // x_norm (null: none): x is a norm's input, applied in fc1's FP8 input cast (fuses_input_norm() only).
  Tensor forward(MLPCtx& ctx, const Tensor& x, const tensor_parallel::Fp8Recompute* fp8_recompute = nullptr,
                 const ops::Fp8Norm* x_norm = nullptr) const;
  // output_bias_grad_elsewhere: fc2's bias grad is taken from the residual stream (output_bias()).
  Tensor backward(MLPCtx& ctx, const Tensor& dy, bool output_bias_grad_elsewhere = false) const;
  Parameter* output_bias() const { return linear_fc2_.residual_bias(); }  // RowParallelLinear::residual_bias
  // Selective recompute "layernorm": drop the input fc1 keeps after the forward (under SP its all-gathered copy) /
  // set it again from the recomputed x before the backward.
  void release_input(MLPCtx& ctx) const { ctx.fc1.x = Tensor(); }
  void restore_input(MLPCtx& ctx, const Tensor& x) const { linear_fc1_.restore_input(ctx.fc1, x); }
  // The activation (GELU or SwiGLU) under FP8 delayed scaling: the activation in fc2's input cast and its gradient in
  // fc1's gradient cast (Transformer Engine's fused activation casts), so neither the activation nor its gradient is
  // written in the activations' dtype.
  bool fp8_act_in_casts() const {
    return !recompute_act_ && linear_fc1_.fp8_fuses_act() && linear_fc2_.fp8_fuses_act();
  }
  // The input's norm in fc1's FP8 input cast (ColumnParallelLinear::fp8_fuses_norm; not for routed experts).
  bool fuses_input_norm() const { return !recompute_act_ && linear_fc1_.fp8_fuses_norm(); }

 private:
  bool swiglu_;
  bool recompute_act_;  // moe_act, routed experts
  int64_t ffn_;  // per TP rank
  tensor_parallel::ColumnParallelLinear linear_fc1_;
  tensor_parallel::RowParallelLinear linear_fc2_;
};

}  // namespace mcpp
