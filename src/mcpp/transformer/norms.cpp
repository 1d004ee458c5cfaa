#include "mcpp/transformer/norms.h"

#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {

Norm::Norm(ParameterRegistry& params, const std::string& prefix, int64_t hidden, Normalization kind, float eps,
           bool sequence_parallel)
    : hidden_(hidden), kind_(kind), eps_(eps) {
  weight_ = params.add({.key = prefix + ".weight", .shape = {hidden}, .init = InitKind::Ones, .no_weight_decay = true,
                        .sequence_parallel = sequence_parallel});
  if (kind == Normalization::LayerNorm)
    bias_ = params.add({.key = prefix + ".bias", .shape = {hidden}, .init = InitKind::Zeros, .no_weight_decay = true,
                        .sequence_parallel = sequence_parallel});
}

Tensor Norm::forward(NormCtx& ctx, const Tensor& x, bool output) const {
  ctx.x = x.view({-1, hidden_});  // [n, h]
  ctx.shape = x.shape();
  const int64_t n = ctx.x.size(0);
  ctx.rstd = Tensor::empty({n}, DType::F32, x.device());
  if (kind_ == Normalization::LayerNorm) ctx.mean = Tensor::empty({n}, DType::F32, x.device());
  return run(ctx, output);
}

Tensor Norm::recompute(NormCtx& ctx) const {
  MCPP_CHECK(ctx.x.defined() && ctx.rstd.defined(), "Norm::recompute needs the context of a forward");
  return run(ctx, true);
}

Tensor Norm::run(NormCtx& ctx, bool output) const {
  Tensor y = output ? Tensor::empty(ctx.x.shape(), ctx.x.dtype(), ctx.x.device()) : Tensor();  // [n, h]
  if (kind_ == Normalization::LayerNorm)
    ops::layernorm_fwd(y, ctx.mean, ctx.rstd, ctx.x, weight_->data, &bias_->data, eps_);
  else
    ops::rmsnorm_fwd(y, ctx.rstd, ctx.x, weight_->data, eps_);
  return output ? y.view(ctx.shape) : y;
}

ops::Fp8Norm Norm::fp8_input(const NormCtx& ctx) const {
  MCPP_CHECK(ctx.x.defined() && ctx.rstd.defined(), "Norm::fp8_input needs the context of a forward");
  return {.mean = ctx.mean, .rstd = ctx.rstd, .weight = weight_->data, .bias = bias_ ? bias_->data : Tensor(),
          .eps = eps_};
}

Tensor Norm::forward_add(NormCtx& ctx, Tensor& sum, const Tensor& a, const Tensor& b, const ops::ResidualDropout& drop,
                         bool output) const {
  ctx.drop = drop;
  ctx.shape = a.shape();
  Tensor s = Tensor::empty(a.shape(), a.dtype(), a.device());
  ctx.x = s.view({-1, hidden_});  // [n, h]
  const int64_t n = ctx.x.size(0);
  const Tensor a2 = a.view({-1, hidden_}), b2 = b.view({-1, hidden_});
  Tensor y = output ? Tensor::empty({n, hidden_}, a.dtype(), a.device()) : Tensor();
  ctx.rstd = Tensor::empty({n}, DType::F32, a.device());
  if (kind_ == Normalization::LayerNorm) {
    ctx.mean = Tensor::empty({n}, DType::F32, a.device());
    ops::add_layernorm_fwd(ctx.x, y, ctx.mean, ctx.rstd, a2, b2, weight_->data, &bias_->data, eps_, drop);
  } else {
    ops::add_rmsnorm_fwd(ctx.x, y, ctx.rstd, a2, b2, weight_->data, eps_, drop);
  }
  if (output) y = y.view(a.shape());
  sum = s;  // last: sum may be the caller's a or b
  return y;
}

Tensor Norm::backward(NormCtx& ctx, const Tensor& dy, const Tensor* dres, const ResidualBiasGrads& rb,
                      Tensor* dbranch) const {
  MCPP_CHECK(dres || (!rb.dres_bias && !rb.dx_bias), "Norm::backward: residual bias grads need dres");
  const bool dropped = ctx.drop.active();
  MCPP_CHECK(!dropped || (dres && dbranch), "Norm::backward: a forward_add with dropout needs dres and dbranch");
  Tensor dx = Tensor::empty(ctx.x.shape(), dy.dtype(), dy.device());  // [n, h]
  Tensor db = dropped ? Tensor::empty(ctx.x.shape(), dy.dtype(), dy.device()) : Tensor();
  Tensor dy2 = dy.view({-1, hidden_});
  Tensor dres2 = dres ? dres->view({-1, hidden_}) : Tensor();
  Tensor* dres_sum = rb.dres_bias ? &rb.dres_bias->main_grad : nullptr;
  Tensor* dx_sum = rb.dx_bias ? &rb.dx_bias->main_grad : nullptr;
  materialize_grads({weight_, bias_, rb.dres_bias, rb.dx_bias});  // the norm ops accumulate
  if (kind_ == Normalization::LayerNorm) {
    if (dres)
      ops::add_layernorm_bwd(dx, weight_->main_grad, &bias_->main_grad, dy2, dres2, ctx.x, weight_->data, ctx.mean,
                             ctx.rstd, dres_sum, dx_sum, ctx.drop, dropped ? &db : nullptr);
    else
      ops::layernorm_bwd(dx, weight_->main_grad, &bias_->main_grad, dy2, ctx.x, weight_->data, ctx.mean, ctx.rstd);
  } else {
    if (dres)
      ops::add_rmsnorm_bwd(dx, weight_->main_grad, dy2, dres2, ctx.x, weight_->data, ctx.rstd, dres_sum, dx_sum,
                           ctx.drop, dropped ? &db : nullptr);
    else
      ops::rmsnorm_bwd(dx, weight_->main_grad, dy2, ctx.x, weight_->data, ctx.rstd);
  }
  weight_->grad_ready();
  if (bias_) bias_->grad_ready();
  if (rb.dres_bias) rb.dres_bias->grad_ready();
  if (rb.dx_bias) rb.dx_bias->grad_ready();
  if (dropped) *dbranch = db.view(dy.shape());
  return dx.view(dy.shape());
}

}  // namespace mcpp
