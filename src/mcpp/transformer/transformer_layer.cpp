#include "mcpp/transformer/transformer_layer.h"

#include <fmt/format.h>

#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {

TransformerLayer::TransformerLayer(ParamAndGradBuffer& params, const std::string& prefix, const TransformerConfig& c,
                                   const TransformerLayerSpec& spec, const tensor_parallel::TPContext& tp)
    : hidden_dropout_(c.hidden_dropout),
      sequence_parallel_(tp.sequence_parallel),
      input_layernorm_(params, prefix + ".input_layernorm", c.hidden_size, c.normalization, c.norm_epsilon,
                       tp.sequence_parallel),
      self_attention_(params, prefix + ".self_attention", c, spec, tp),
      pre_mlp_layernorm_(params, prefix + ".pre_mlp_layernorm", c.hidden_size, c.normalization, c.norm_epsilon,
                         tp.sequence_parallel),
      mlp_(params, prefix + ".mlp", c, tp) {}

Tensor TransformerLayer::forward(TransformerLayerCtx& ctx, const Tensor& x, const RopeTables* rope,
                                 const ForwardOptions& opt) const {
  ctx.dropout = dropout_active(opt, hidden_dropout_);
  if (ctx.dropout) MCPP_CHECK(opt.rng, "hidden dropout needs an RNG stream");
  Tensor ln1 = input_layernorm_.forward(ctx.input_layernorm, x);
  Tensor attn = self_attention_.forward(ctx.self_attention, ln1, rope, opt);  // [s, b, h]
  if (ctx.dropout) {
    ctx.attn_dropout_key = opt.rng->draw(static_cast<uint64_t>(attn.numel()), sequence_parallel_);
    ops::dropout_fwd(attn, attn, hidden_dropout_, ctx.attn_dropout_key);
  }
  Tensor x1 = Tensor::empty(x.shape(), x.dtype(), x.device());
  ops::add(x1, x, attn);  // residual
  Tensor ln2 = pre_mlp_layernorm_.forward(ctx.pre_mlp_layernorm, x1);
  Tensor mlp = mlp_.forward(ctx.mlp, ln2);
  if (ctx.dropout) {
    ctx.mlp_dropout_key = opt.rng->draw(static_cast<uint64_t>(mlp.numel()), sequence_parallel_);
    ops::dropout_fwd(mlp, mlp, hidden_dropout_, ctx.mlp_dropout_key);
  }
  ops::add_inplace(mlp, x1);  // residual: y = x1 + mlp
  return mlp;
}

Tensor TransformerLayer::backward(TransformerLayerCtx& ctx, const Tensor& dy, const RopeTables* rope) const {
  // MLP branch: dx1 = dy + d(pre_mlp_layernorm)(mlp^T(dropout^T(dy)))
  Tensor dmlp = dy;
  if (ctx.dropout) {
    dmlp = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    ops::dropout_bwd(dmlp, dy, hidden_dropout_, ctx.mlp_dropout_key);
  }
  Tensor dx1 = pre_mlp_layernorm_.backward(ctx.pre_mlp_layernorm, mlp_.backward(ctx.mlp, dmlp));
  ops::add_inplace(dx1, dy);
  // Attention branch: dx = dx1 + d(input_layernorm)(attn^T(dropout^T(dx1)))
  Tensor dattn = dx1;
  if (ctx.dropout) {
    dattn = Tensor::empty(dx1.shape(), dx1.dtype(), dx1.device());
    ops::dropout_bwd(dattn, dx1, hidden_dropout_, ctx.attn_dropout_key);
  }
  Tensor dx = input_layernorm_.backward(ctx.input_layernorm, self_attention_.backward(ctx.self_attention, dattn, rope));
  ops::add_inplace(dx, dx1);
  return dx;
}

TransformerBlock::TransformerBlock(ParamAndGradBuffer& params, const TransformerConfig& c,
                                   const TransformerLayerSpec& spec, const tensor_parallel::TPContext& tp,
                                   int64_t first_layer, int64_t num_layers, bool post_process) {
  for (int64_t i = 0; i < num_layers; ++i)
    layers_.push_back(
        std::make_unique<TransformerLayer>(params, fmt::format("decoder.layers.{}", first_layer + i), c, spec, tp));
  if (post_process)
    final_layernorm_ = std::make_unique<Norm>(params, "decoder.final_layernorm", c.hidden_size, c.normalization,
                                              c.norm_epsilon, tp.sequence_parallel);
}

Tensor TransformerBlock::forward(TransformerBlockCtx& ctx, const Tensor& x, const RopeTables* rope,
                                 const ForwardOptions& opt) const {
  ctx.layers.resize(layers_.size());
  Tensor h = x;
  for (size_t i = 0; i < layers_.size(); ++i) h = layers_[i]->forward(ctx.layers[i], h, rope, opt);
  if (final_layernorm_) h = final_layernorm_->forward(ctx.final_layernorm, h);
  return h;
}

Tensor TransformerBlock::backward(TransformerBlockCtx& ctx, const Tensor& dy, const RopeTables* rope) const {
  Tensor d = dy;
  if (final_layernorm_) d = final_layernorm_->backward(ctx.final_layernorm, d);
  for (size_t i = layers_.size(); i-- > 0;) d = layers_[i]->backward(ctx.layers[i], d, rope);
  return d;
}

}  // namespace mcpp
