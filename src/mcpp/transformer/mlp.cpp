#include "mcpp/transformer/mlp.h"

#include <cmath>

#include "mcpp/kernels/ops.h"

namespace mcpp {

MLP::MLP(ParamAndGradBuffer& params, const std::string& prefix, const TransformerConfig& c)
    : swiglu_(c.swiglu),
      ffn_(c.ffn_hidden_size),
      linear_fc1_(params, prefix + ".linear_fc1",
                  {.in_features = c.hidden_size,
                   .out_features = c.swiglu ? 2 * c.ffn_hidden_size : c.ffn_hidden_size,
                   .bias = c.add_bias_linear,
                   .init_std = c.init_method_std}),
      linear_fc2_(params, prefix + ".linear_fc2",
                  {.in_features = c.ffn_hidden_size,
                   .out_features = c.hidden_size,
                   .bias = c.add_bias_linear,
                   .init_std = c.init_method_std / std::sqrt(2.0f * static_cast<float>(c.num_layers))}) {}

Tensor MLP::forward(MLPCtx& ctx, const Tensor& x) const {
  Shape shape = x.shape();
  ctx.pre_act = linear_fc1_.forward(ctx.fc1, x).view({-1, swiglu_ ? 2 * ffn_ : ffn_});  // [n, f|2f]
  Tensor act = Tensor::empty({ctx.pre_act.size(0), ffn_}, DType::F32, x.device());     // [n, f]
  if (swiglu_) ops::swiglu_fwd(act, ctx.pre_act);
  else ops::gelu_fwd(act, ctx.pre_act);
  return linear_fc2_.forward(ctx.fc2, act).view(shape);  // [s, b, h]
}

Tensor MLP::backward(MLPCtx& ctx, const Tensor& dy) const {
  Tensor dact = linear_fc2_.backward(ctx.fc2, dy).view({-1, ffn_});  // [n, f]
  Tensor dpre = Tensor::empty(ctx.pre_act.shape(), DType::F32, dy.device());
  if (swiglu_) ops::swiglu_bwd(dpre, dact, ctx.pre_act);
  else ops::gelu_bwd(dpre, dact, ctx.pre_act);
  return linear_fc1_.backward(ctx.fc1, dpre).view(dy.shape());
}

}  // namespace mcpp
