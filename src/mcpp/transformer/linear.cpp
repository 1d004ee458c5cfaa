#include "mcpp/transformer/linear.h"

#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {

Linear::Linear(ParamAndGradBuffer& params, const std::string& prefix, const LinearOptions& opt)
    : in_(opt.in_features), out_(opt.out_features) {
  weight_ = params.add({.key = prefix + ".weight", .shape = {out_, in_}, .init = InitKind::Normal, .std = opt.init_std});
  if (opt.bias)
    bias_ = params.add({.key = prefix + ".bias", .shape = {out_}, .init = InitKind::Zeros, .no_weight_decay = true});
}

Tensor Linear::forward(LinearCtx& ctx, const Tensor& x) const {
  MCPP_CHECK(x.size(-1) == in_, "Linear({}): input {} has last dim != {}", weight_->spec.key, x.str(), in_);
  Shape out_shape = x.shape();
  out_shape.back() = out_;
  ctx.x = x.view({-1, in_});                                          // [n, in]
  Tensor y = Tensor::empty({ctx.x.size(0), out_}, DType::F32, x.device());  // [n, out]
  ops::linear_fwd(y, ctx.x, weight_->data, bias_ ? &bias_->data : nullptr);
  return y.view(out_shape);
}

Tensor Linear::backward(LinearCtx& ctx, const Tensor& dy, bool need_dx) const {
  Tensor dy2 = dy.view({-1, out_});  // [n, out]
  Tensor dx;
  if (need_dx) dx = Tensor::empty({ctx.x.size(0), in_}, DType::F32, dy.device());  // [n, in]
  ops::linear_bwd(need_dx ? &dx : nullptr, weight_->main_grad, bias_ ? &bias_->main_grad : nullptr, dy2, ctx.x,
                  weight_->data);
  if (!need_dx) return {};
  Shape in_shape = dy.shape();
  in_shape.back() = in_;
  return dx.view(in_shape);
}

}  // namespace mcpp
