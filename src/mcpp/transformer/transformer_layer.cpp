#include "mcpp/transformer/transformer_layer.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "mcpp/core/error.h"
#include "mcpp/core/module_trace.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/transformer/attention.h"
#include "mcpp/transformer/mlp.h"
#include "mcpp/transformer/moe/moe_layer.h"
#include "mcpp/transformer/multi_latent_attention.h"

namespace mcpp {

TransformerLayer::TransformerLayer(ParameterRegistry& params, ParameterRegistry& expert_params,
                                   const std::string& prefix, const TransformerConfig& c,
                                   const TransformerLayerSpec& spec, const tensor_parallel::TPContext& tp)
    : hidden_dropout_(c.hidden_dropout),
      sequence_parallel_(tp.sequence_parallel),
      input_layernorm_(
          spec.make_input_layernorm(params, prefix + ".input_layernorm", c.hidden_size, tp.sequence_parallel)),
      self_attention_(spec.make_attention(params, prefix + ".self_attention", c, spec, tp)),
      pre_mlp_layernorm_(
          spec.make_pre_mlp_layernorm(params, prefix + ".pre_mlp_layernorm", c.hidden_size, tp.sequence_parallel)),
      mlp_(spec.make_mlp(params, expert_params, prefix + ".mlp", c, spec, tp)),
      recompute_mlp_(c.recomputes(mlp_->recompute_name())),
      recompute_norms_(c.recomputes("layernorm")),
      name_(prefix) {}

void TransformerLayerCtx::for_each_tensor(const TensorVisitor& f) const {
  visit_ctx_tensors(input_layernorm, f);
  self_attention.for_each_tensor(f);
  visit_ctx_tensors(pre_mlp_layernorm, f);
  mlp.for_each_tensor(f);
  f(mlp_input);
}

Tensor Residual::sum() {
  if (!b.defined()) return a;
  if (drop.active()) ops::dropout_fwd(b, b, drop.p, drop.key);  // b: the layer's mlp output, owned by the stream
  ops::add_inplace(b, a);                                        // b = b + a
  *this = Residual{b, Tensor()};
  return a;
}

Residual TransformerLayer::forward(TransformerLayerCtx& ctx, const Residual& in, const RopeTables* rope,
                                   const ForwardOptions& opt) const {
  const ModuleScope m(name_, in.a);
  ctx.dropout = dropout_active(opt, hidden_dropout_);
  if (ctx.dropout) MCPP_CHECK(opt.rng, "hidden dropout needs an RNG stream");
  // FP8: the norms applied in their linears' input casts (the header); their outputs are then never written
  const bool cast_norms = !recompute_norms_ && !opt.inference;
  ctx.input_norm_in_cast = cast_norms && self_attention_->fuses_input_norm();
  Tensor x, ln1;  // x = the input's value (written by the fused add when unsummed)
  if (in.b.defined()) {
    ln1 = input_layernorm_.forward_add(ctx.input_layernorm, x, in.a, in.b, in.drop, !ctx.input_norm_in_cast);
  } else {
    x = in.a;
    ln1 = input_layernorm_.forward(ctx.input_layernorm, x, !ctx.input_norm_in_cast);
  }
  ForwardOptions attn_opt = opt;
  ops::Fp8Norm norm1;
  attn_opt.input_norm = nullptr;
  if (ctx.input_norm_in_cast) norm1 = input_layernorm_.fp8_input(ctx.input_layernorm), attn_opt.input_norm = &norm1;
  Tensor attn = self_attention_->forward(ctx.self_attention, ctx.input_norm_in_cast ? x : ln1, rope,
                                         attn_opt);  // [s, b, h]
  ctx.norms_dropped = recompute_norms_ && opt.training;
  if (ctx.norms_dropped) {  // "layernorm": backward re-runs input_layernorm for linear_qkv
    self_attention_->release_input(ctx.self_attention);
    ln1 = Tensor();
  }
  ops::ResidualDropout attn_drop;
  if (ctx.dropout)
    attn_drop = {hidden_dropout_, opt.rng->draw(static_cast<uint64_t>(attn.numel()), sequence_parallel_)};
  const bool recompute = recompute_mlp_ && opt.training;
  ctx.mlp_norm_in_cast = cast_norms && !recompute && mlp_->fuses_input_norm();
  Tensor x1;  // x1 = x + dropout(attn), fused with the norm (ln2 = norm(x1), computed from the rounded x1)
  Tensor ln2 = pre_mlp_layernorm_.forward_add(ctx.pre_mlp_layernorm, x1, x, attn, attn_drop, !ctx.mlp_norm_in_cast);
  ctx.has_mlp_rng = recompute && mlp_->draws_rng() && opt.rng;
  if (ctx.has_mlp_rng) ctx.mlp_rng = *opt.rng;  // the router's draws, replayed by the re-run
  ctx.mlp_fp8 = {};
  ForwardOptions mlp_opt = opt;
  ops::Fp8Norm norm2;
  mlp_opt.input_norm = nullptr;
  if (ctx.mlp_norm_in_cast) norm2 = pre_mlp_layernorm_.fp8_input(ctx.pre_mlp_layernorm), mlp_opt.input_norm = &norm2;
  tensor_parallel::Fp8Recompute mlp_fp8;  // the FP8 scales recorded for the re-run (fp8_recompute.h)
  if (recompute) {
    mlp_fp8 = tensor_parallel::Fp8Recompute::recording(opt.fp8_recompute, ctx.mlp_fp8);
    mlp_opt.fp8_recompute = &mlp_fp8;
  }
  Tensor mlp = mlp_->forward(ctx.mlp, ctx.mlp_norm_in_cast ? x1 : ln2, mlp_opt);
  ctx.mlp_dropped = recompute;
  if (recompute) {  // keep the input only; backward re-runs the MLP
    ctx.mlp_input = ln2;
    ctx.mlp.reset();
  }
  if (ctx.norms_dropped) {  // not even the input: backward re-runs pre_mlp_layernorm (then the MLP under recompute)
    ctx.mlp_input = Tensor();
    if (!recompute) mlp_->release_input(ctx.mlp);
  }
  Residual y{x1, mlp};  // y = x1 + dropout(mlp), added by the next norm (or Residual::sum)
  if (ctx.dropout) {
    ctx.mlp_dropout_key = opt.rng->draw(static_cast<uint64_t>(mlp.numel()), sequence_parallel_);
    y.drop = {hidden_dropout_, ctx.mlp_dropout_key};
  }
  m.out(y.a);
  return y;
}

ResidualGrad TransformerLayer::backward(TransformerLayerCtx& ctx, const ResidualGrad& dy, const RopeTables* rope,
                                       float loss_grad_scale) const {
  const ModuleScope m(name_, dy.sum, ModuleScope::kBackward);
  // MLP branch: dx1 = dy + d(pre_mlp_layernorm)(mlp^T(dropout^T(dy))). Under dropout the norm that added
  // y = x1 + dropout(mlp) returned dmlp, unless y was summed apart.
  Tensor dmlp = dy.sum;
  if (ctx.dropout && dy.branch.defined()) {
    dmlp = dy.branch;
  } else if (ctx.dropout) {
    dmlp = Tensor::empty(dy.sum.shape(), dy.sum.dtype(), dy.sum.device());
    ops::dropout_bwd(dmlp, dy.sum, hidden_dropout_, ctx.mlp_dropout_key);
  }
  // The gradients reaching fc2's output (dy, without dropout) and linear_proj's (dattn: dx1 without dropout)
  // are read or written by pre_mlp_layernorm's fused backward: their bias grads (the column sums) ride in it
  // (ResidualBiasGrads), not in the linears' backward; under dropout fc2's stays in the linear (header).
  // A MoE layer's output has no bias of its own (each expert's fc2 bias is inside the weighted sum).
  Parameter* mlp_bias = mlp_->output_bias();
  const ResidualBiasGrads rb = ctx.dropout ? ResidualBiasGrads{nullptr, self_attention_->output_bias()}
                                           : ResidualBiasGrads{mlp_bias, self_attention_->output_bias()};
  if (ctx.mlp_dropped || ctx.norms_dropped) {  // selective recompute: the MLP's input (its norm re-run) and context
    const Tensor in = ctx.norms_dropped ? pre_mlp_layernorm_.recompute(ctx.pre_mlp_layernorm) : ctx.mlp_input;
    if (!ctx.mlp_dropped) mlp_->restore_input(ctx.mlp, in);
    else {  // no losses; the first forward's FP8 scales
      const auto replay = tensor_parallel::Fp8Recompute::replaying(ctx.mlp_fp8);
      mlp_->forward(ctx.mlp, in,
                    {.training = true, .rng = ctx.has_mlp_rng ? &ctx.mlp_rng : nullptr, .fp8_recompute = &replay});
      ctx.mlp_fp8 = {};
    }
    ctx.mlp_input = Tensor();
  }
  Tensor dmlp_in = mlp_->backward(ctx.mlp, dmlp, loss_grad_scale, rb.dres_bias != nullptr);
  Tensor dattn;  // attention branch: dx = dx1 + d(input_layernorm)(attn^T(dropout^T(dx1)))
  Tensor dx1 = pre_mlp_layernorm_.backward(ctx.pre_mlp_layernorm, dmlp_in, &dy.sum, rb,
                                           &dattn);  // + dy and the dropout backward fused
  if (!ctx.dropout) dattn = dx1;
  if (ctx.norms_dropped) {
    const Tensor ln1 = input_layernorm_.recompute(ctx.input_layernorm);
    self_attention_->restore_input(ctx.self_attention, ln1);
  }
  ResidualGrad dx;  // + dx1 fused into the norm's backward; with the input's dropout also its branch gradient
  dx.sum = input_layernorm_.backward(ctx.input_layernorm,
                                     self_attention_->backward(ctx.self_attention, dattn, rope, rb.dx_bias != nullptr),
                                     &dx1, {}, &dx.branch);
  m.out(dx.sum);
  return dx;
}

std::vector<RecomputeGroup> recompute_plan(const TransformerConfig& c, int64_t n) {
  std::vector<RecomputeGroup> groups;
  if (c.recompute_granularity != "full") return groups;
  const int64_t k = c.recompute_num_layers;
  if (c.recompute_method == "uniform") {
    for (int64_t i = 0; i < n; i += k) groups.push_back({i, std::min(k, n - i)});
  } else if (c.recompute_method == "block") {
    for (int64_t i = 0; i < std::min(k, n); ++i) groups.push_back({i, 1});
  } else {
    fail("recompute_method: '{}' is not uniform or block (recompute_granularity full)", c.recompute_method);
  }
  return groups;
}

std::vector<moe::TopKRouter*> TransformerBlock::routers() const {
  std::vector<moe::TopKRouter*> out;
  for (const auto& l : layers_)
    if (moe::MoELayer* m = l->moe_layer()) out.push_back(&m->router());
  return out;
}

TransformerBlock::TransformerBlock(ParameterRegistry& params, ParameterRegistry& expert_params,
                                   const TransformerConfig& c, const TransformerBlockSpec& spec,
                                   const tensor_parallel::TPContext& tp, int64_t first_layer, int64_t num_layers,
                                   bool post_process)
    : groups_(recompute_plan(c, num_layers)) {
  MCPP_CHECK(first_layer + num_layers <= static_cast<int64_t>(spec.layer_specs.size()),
             "TransformerBlock: the spec has {} layer specs, layers [{}, {}) asked", spec.layer_specs.size(),
             first_layer, first_layer + num_layers);
  for (int64_t i = 0; i < num_layers; ++i) {
    layers_.push_back(std::make_unique<TransformerLayer>(params, expert_params,
                                                         fmt::format("decoder.layers.{}", first_layer + i), c,
                                                         spec.layer_specs[static_cast<size_t>(first_layer + i)], tp));
    if (moe::MoELayer* m = layers_.back()->moe_layer()) m->router().set_layer_number(first_layer + i);
  }
  if (post_process)
    final_layernorm_ = std::make_unique<Norm>(
        spec.make_final_layernorm(params, "decoder.final_layernorm", c.hidden_size, tp.sequence_parallel));
}

Residual TransformerBlock::forward_layers(TransformerBlockCtx& ctx, int64_t first, int64_t count, Residual x,
                                          const RopeTables* rope, const ForwardOptions& opt) const {
  Residual h = std::move(x);
  for (int64_t i = first; i < first + count; ++i) {
    ctx.layers[static_cast<size_t>(i)] = {};
    h = layers_[static_cast<size_t>(i)]->forward(ctx.layers[static_cast<size_t>(i)], h, rope, opt);
  }
  return h;
}

Tensor TransformerBlock::forward(TransformerBlockCtx& ctx, const Tensor& x, const RopeTables* rope,
                                 const ForwardOptions& opt) const {
  const ModuleScope m("decoder", x);
  const auto n = static_cast<int64_t>(layers_.size());
  ctx.layers.assign(layers_.size(), {});
  ctx.recompute.assign(groups_.size(), {});
  Residual h{x, Tensor()};
  int64_t i = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    h = forward_layers(ctx, i, groups_[g].first - i, std::move(h), rope, opt);  // layers before the group: kept
    RecomputeState& st = ctx.recompute[g];
    st.input = h.sum();  // kept as one tensor
    st.replay = ForwardReplay::of(opt);  // the streams as the group's forward finds them
    const tensor_parallel::Fp8Recompute record = tensor_parallel::Fp8Recompute::recording(opt.fp8_recompute, st.fp8);
    ForwardOptions group_opt = opt;
    group_opt.fp8_recompute = &record;  // the FP8 scales the re-run casts with
    h = forward_layers(ctx, groups_[g].first, groups_[g].count, std::move(h), rope, group_opt);
    for (int64_t j = groups_[g].first; j < groups_[g].first + groups_[g].count; ++j)
      ctx.layers[static_cast<size_t>(j)] = {};  // dropped: rebuilt in backward
    i = groups_[g].first + groups_[g].count;
  }
  h = forward_layers(ctx, i, n - i, std::move(h), rope, opt);
  if (!final_layernorm_) return m.ret(h.sum());
  // The last residual add inside the final norm (the norm's context keeps the sum); its backward has no dres,
  // so a dropped branch is summed apart (Residual::sum) and the last layer applies its dropout backward.
  if (h.drop.active()) h.sum();
  if (!h.b.defined()) return m.ret(final_layernorm_->forward(ctx.final_layernorm, h.a));
  Tensor sum;
  return m.ret(final_layernorm_->forward_add(ctx.final_layernorm, sum, h.a, h.b));
}

Tensor TransformerBlock::backward(TransformerBlockCtx& ctx, const Tensor& dy, const RopeTables* rope,
                                  float loss_grad_scale) const {
  MCPP_CHECK(ctx.layers.size() == layers_.size() && ctx.recompute.size() == groups_.size(),
             "TransformerBlock::backward needs the context of this block's forward");
  const ModuleScope m("decoder", dy, ModuleScope::kBackward);
  ResidualGrad d{dy, Tensor()};
  if (final_layernorm_) d.sum = final_layernorm_->backward(ctx.final_layernorm, d.sum);
  size_t g = groups_.size();
  for (auto i = static_cast<int64_t>(layers_.size()); i-- > 0;) {
    if (g > 0 && i == groups_[g - 1].first + groups_[g - 1].count - 1) {  // last layer of a recomputed group
      --g;
      RecomputeState& st = ctx.recompute[g];
      ForwardOptions rerun = st.replay.options();  // the same draws as the original forward (output unused)
      const auto replay = tensor_parallel::Fp8Recompute::replaying(st.fp8);  // and the same FP8 scales
      rerun.fp8_recompute = &replay;
      forward_layers(ctx, groups_[g].first, groups_[g].count, Residual{st.input, Tensor()}, rope, rerun);
      st = {};
    }
    d = layers_[static_cast<size_t>(i)]->backward(ctx.layers[static_cast<size_t>(i)], d, rope, loss_grad_scale);
    ctx.layers[static_cast<size_t>(i)] = {};  // consumed
  }
  MCPP_CHECK(!d.branch.defined(), "TransformerBlock::backward: the block's input has no residual branch");
  return m.ret(d.sum);
}

int64_t TransformerLayer::saved_bytes(const TransformerConfig& m, const ActivationDims& d, bool moe) {
  const int64_t norm_out = m.recomputes("layernorm") ? 0 : 1;  // "layernorm": the norms' outputs kept nowhere
  const int64_t attention = m.multi_latent_attention ? MLASelfAttention::saved_bytes(m, d, norm_out)
                                                     : SelfAttention::saved_bytes(m, d);
  int64_t mlp = moe ? moe::MoELayer::saved_bytes(m, d, norm_out) : MLP::saved_bytes(m, d, d.n, d.f, norm_out > 0);
  if (m.recomputes(moe ? "moe" : "mlp")) mlp = norm_out * d.n_local * d.h * d.e;  // selective: only the MLP's input
  // linear_qkv's input (the norm output; gathered under SP), or under FP8 its casts (the input dropped)
  const int64_t qkv_input = d.fp8 && !m.multi_latent_attention
                                ? fp8_saved_bytes(d, d.n, d.h, (d.np + 2 * d.ng) * d.hn)
                                : norm_out * d.n * d.h * d.e;
  return 2 * norm_stats_bytes(m, d)      // input_layernorm's and pre_mlp_layernorm's statistics
         + qkv_input                     // linear_qkv's input, or its FP8 casts
         + attention                     //
         + d.n_local * d.h * d.e         // x1 = x + attention (pre_mlp_layernorm's input)
         + mlp;
}

}  // namespace mcpp
