// LayerNorm / RMSNorm over the hidden dim (Megatron's FusedLayerNorm / RMSNorm).
// Params: <prefix>.weight [h] (ones) and, for LayerNorm, <prefix>.bias [h] (zeros); no weight decay.
// With sequence parallelism the norm runs on [s/tp, b, h] shards: its params are marked
// sequence_parallel and finalize_model_grads all-reduces their (partial) grads over TP.
// Backward: dweight/dbias ACCUMULATE into main_grad; dx returned.
// Fused residual (ops add_layernorm_fwd / add_layernorm_bwd and the RMSNorm pair): forward_add returns
// norm(a + b) and the residual sum a + b (the norm's saved input); backward's dres adds the gradient the
// sum receives from its other consumer into dx, in the same kernel. With a residual dropout on b (Megatron's
// bias-dropout-add under hidden dropout) the forward adds dropout(b) and the backward also returns b's
// gradient (dbranch), both inside the norm kernels.
// Into an FP8 cast (Transformer Engine's LayerNormLinear): with output = false the forwards write the statistics (and
// the sum) only and return an undefined tensor; fp8_input(ctx) is the norm the consuming linear then applies in its
// input cast (ops.h Fp8Act::Norm), the same bytes as the output not written. The backward is the same either way.
#pragma once
#include <string>

#include "mcpp/core/tensor.h"
#include "mcpp/core/parameter.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/transformer/transformer_config.h"

namespace mcpp {

struct NormCtx {
  Tensor x;     // [n, h]
  Tensor mean;  // [n] (LayerNorm only)
  Tensor rstd;  // [n]
  ops::ResidualDropout drop;  // forward_add's dropout on b (inactive: none)
  Shape shape;  // the forward's output shape (x's, or a's)
};

// Bias parameters whose grads a fused backward (with dres) takes from the residual stream: dres_bias +=
// the column sums of dres, dx_bias += the column sums of the branch b's gradient (dbranch under a residual
// dropout, else dx) (ops::add_layernorm_bwd's residual sums); each then reports grad_ready from
// Norm::backward. For the linears whose outputs meet at this residual add.
struct ResidualBiasGrads {
  Parameter* dres_bias = nullptr;
  Parameter* dx_bias = nullptr;
};

class Norm {
 public:
  Norm(ParameterRegistry& params, const std::string& prefix, int64_t hidden, Normalization kind, float eps,
       bool sequence_parallel);
  Tensor forward(NormCtx& ctx, const Tensor& x, bool output = true) const;  // x [..., h] -> [..., h]
  // sum = a + b (a, b [..., h] of one shape; sum gets a's shape, dtype and device), returns norm(sum).
  // drop active: sum = a + dropout(b) (ops::dropout_fwd's mask and values; b is not written); the backward
  // must then take dres and dbranch.
  Tensor forward_add(NormCtx& ctx, Tensor& sum, const Tensor& a, const Tensor& b, const ops::ResidualDropout& drop = {},
                     bool output = true) const;
  // The norm of the last forward's input (ctx.x) as an FP8 cast applies it.
  ops::Fp8Norm fp8_input(const NormCtx& ctx) const;
  // dx = d(norm)/dx (dy) (+ dres [..., h] when non-null; then also the residual bias grads rb). After a
  // forward_add with dropout, *dbranch = b's gradient (dropout_bwd of dx, written in the same kernel).
  Tensor backward(NormCtx& ctx, const Tensor& dy, const Tensor* dres = nullptr, const ResidualBiasGrads& rb = {},
                  Tensor* dbranch = nullptr) const;
  // The last forward's (or forward_add's) output again, from ctx's kept input (forward_add's: the sum), for
  // selective recompute "layernorm"; the statistics are written again with the same values. Bitwise the forward's:
  // the fused add + norm normalizes the rounded sum with the plain norm's reduction layout.
  Tensor recompute(NormCtx& ctx) const;

 private:
  Tensor run(NormCtx& ctx, bool output) const;  // the plain norm of ctx.x into ctx's statistics (and y when output)

  Parameter* weight_ = nullptr;
  Parameter* bias_ = nullptr;
  int64_t hidden_;
  Normalization kind_;
  float eps_;
};

}  // namespace mcpp
