#include "mcpp/transformer/attention.h"

#include <cmath>

#include "mcpp/core/error.h"
#include "mcpp/core/module_trace.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/tensor_parallel/mappings.h"

namespace mcpp {

tensor_parallel::ParallelLinearOptions attention_output_options(const TransformerConfig& c,
                                                                const TransformerLayerSpec& spec,
                                                                const tensor_parallel::TPContext& tp,
                                                                int64_t input_size) {
  return {.input_size = input_size,
          .output_size = c.hidden_size,
          .bias = c.add_bias_linear,
          .init_std = c.init_method_std / std::sqrt(2.0f * static_cast<float>(c.num_layers)),
          .sequence_parallel = tp.sequence_parallel,
          .tp_comm_overlap = tp.comm_overlap,
          .fp8 = spec.linear_fp8};
}

SelfAttention::SelfAttention(ParameterRegistry& params, const std::string& prefix, const TransformerConfig& c,
                             const TransformerLayerSpec& spec, const tensor_parallel::TPContext& tp)
    : name_(prefix),
      np_(c.num_attention_heads / tp.size()),
      ng_(c.num_query_groups / tp.size()),
      hn_(c.kv_channels),
      h_(c.hidden_size),
      softmax_scale_(1.0f / std::sqrt(static_cast<float>(hn_))),
      linear_qkv_(params, prefix + ".linear_qkv",
                  {.input_size = c.hidden_size,
                   .output_size = (c.num_attention_heads + 2 * c.num_query_groups) * c.kv_channels,
                   .bias = c.add_bias_linear || c.add_qkv_bias,
                   .init_std = c.init_method_std,
                   .sequence_parallel = tp.sequence_parallel,
                   .tp_comm_overlap = tp.comm_overlap,
                   .fp8 = spec.linear_fp8},
                  tp.group),
      linear_proj_(params, prefix + ".linear_proj",
                   attention_output_options(c, spec, tp, c.num_attention_heads * c.kv_channels), tp.group),
      recompute_core_(c.recomputes("core_attn")),
      cp_(tp.cp && tp.cp->size() > 1 && !tp.cp_p2p ? tp.cp : nullptr) {
  MCPP_CHECK(c.num_query_groups % tp.size() == 0, "num_query_groups {} not divisible by tp={}", c.num_query_groups,
             tp.size());
  if (c.qk_layernorm) {  // Megatron registers them after linear_qkv / linear_proj
    q_layernorm_.emplace(params, prefix + ".q_layernorm", hn_, c.normalization, c.norm_epsilon, tp.size() > 1);
    k_layernorm_.emplace(params, prefix + ".k_layernorm", hn_, c.normalization, c.norm_epsilon, tp.size() > 1);
  }
  const CoreAttentionOptions core_opt{.softmax_scale = softmax_scale_,
                                      .attention_dropout = c.attention_dropout,
                                      .causal = true,
                                      .deterministic = c.deterministic_mode};
  if (tp.cp_size() > 1 && tp.cp_p2p) {  // ring attention: every head of this TP rank, this CP rank's rows
    core_np_ = np_;
    core_ng_ = ng_;
    core_ = spec.make_core_attention(core_opt, tp);  // the spec's core builds the ring form under p2p
    return;
  }
  const int64_t cp = tp.cp_size();
  if (ng_ % cp != 0)
    fail("context parallelism (all-to-all): num_query_groups ({}) must be divisible by tensor_model_parallel_size * "
         "context_parallel_size ({}): each CP rank attends over whole query groups",
         c.num_query_groups, tp.size() * cp);
  core_np_ = np_ / cp;
  core_ng_ = ng_ / cp;
  core_ = spec.make_core_attention(core_opt, tp);
}

void SelfAttention::split_heads(SelfAttentionCtx& ctx, const Tensor& qkv, const RopeTables* rope, Tensor& q, Tensor& k,
                                Tensor& v) const {
  // (per-token tables of packed sequences: [s*b, 1, ..] views, rope.h)
  if (rope && !q_layernorm_) {
    Tensor qr = rope_token_rows(q, *rope), kr = rope_token_rows(k, *rope), vr = rope_token_rows(v, *rope);
    ops::qkv_split_rope(qr, kr, vr, rope_token_rows(qkv, *rope), rope->cos, rope->sin);  // one pass
    return;
  }
  ops::qkv_split(q, k, v, qkv);
  if (q_layernorm_) {  // over hn, per head (the norms keep the split q, k as their saved inputs)
    q = q_layernorm_->forward(ctx.q_norm, q);
    k = k_layernorm_->forward(ctx.k_norm, k);
  }
  if (rope) {
    Tensor qr = rope_token_rows(q, *rope), kr = rope_token_rows(k, *rope);
    ops::rope_fwd(qr, qr, rope->cos, rope->sin);
    ops::rope_fwd(kr, kr, rope->cos, rope->sin);
  }
}

Tensor SelfAttention::forward_cached(SelfAttentionCtx& ctx, const Tensor& x, const RopeTables* rope,
                                     InferenceContext& ic) const {
  MCPP_CHECK(!cp_ && core_np_ == np_, "{}: generation with a KV cache runs without context parallelism", name_);
  const Tensor qkv = linear_qkv_.forward(ctx.qkv, x);  // [s, b, ng/tp*(np/ng+2)*hn]
  const int64_t s = qkv.size(0), b = qkv.size(1);
  // A decode step's [1, b] rows split as [b, 1]: its RoPE tables hold one row per sequence (at its position).
  const bool decode = !ic.prefill();
  const int64_t rs = decode ? b : s, rb = decode ? 1 : b;
  Tensor q = Tensor::empty({rs, rb, np_, hn_}, qkv.dtype(), qkv.device());  // [s, b, np/tp, hn]
  Tensor k = Tensor::empty({rs, rb, ng_, hn_}, qkv.dtype(), qkv.device());  // [s, b, ng/tp, hn]
  Tensor v = Tensor::empty({rs, rb, ng_, hn_}, qkv.dtype(), qkv.device());
  split_heads(ctx, qkv.view({rs, rb, -1}), rope, q, k, v);
  const Tensor context = ic.attend(name_, *core_, ctx.core, q.view({s, b, np_, hn_}), k.view({s, b, ng_, hn_}),
                                   v.view({s, b, ng_, hn_}), softmax_scale_);  // [s, b, np/tp, hn]
  return linear_proj_.forward(ctx.proj, context.view({s, b, np_ * hn_}));  // [s, b, h]
}

Tensor SelfAttention::forward(SelfAttentionCtx& ctx, const Tensor& x, const RopeTables* rope,
                              const ForwardOptions& opt) const {
  if (opt.inference) return forward_cached(ctx, x, rope, *opt.inference);
  const ModuleScope m("self_attention", x);
  Tensor qkv = linear_qkv_.forward(ctx.qkv, x, opt.fp8_recompute, opt.input_norm);  // [s/cp, b, ng/tp*(np/ng+2)*hn]
  if (cp_) qkv = tensor_parallel::all_to_all_cp2hp(*cp_, qkv);  // [s, b, ng/tp/cp*(np/ng+2)*hn]
  const int64_t s = qkv.size(0), b = qkv.size(1);
  if (recompute_core_) ctx.core_replay = ForwardReplay::of(opt);
  Tensor context;  // [s, b, np/tp/cp, hn]
  if (packed(rope)) {
    const ModuleScope core_scope("core_attention", qkv);
    context = core_scope.ret(core_->forward_qkv(ctx.core, qkv, core_np_, core_ng_, opt));
    if (recompute_core_) {  // selective recompute: keep the fused input, drop the core's saved state
      ctx.fused_qkv = qkv;
      ctx.core = {};
    }
  } else {
    const DType dt = qkv.dtype();
    const Device dev = qkv.device();
    Tensor q = Tensor::empty({s, b, core_np_, hn_}, dt, dev);  // [s, b, np/tp/cp, hn]
    Tensor k = Tensor::empty({s, b, core_ng_, hn_}, dt, dev);  // [s, b, ng/tp/cp, hn]
    Tensor v = Tensor::empty({s, b, core_ng_, hn_}, dt, dev);
    split_heads(ctx, qkv, rope, q, k, v);
    {
      const ModuleScope core_scope("core_attention", q);
      context = core_scope.ret(core_->forward(ctx.core, q, k, v, opt));
    }
    if (recompute_core_) {  // selective recompute: keep the inputs, drop the core's saved state
      ctx.q = q, ctx.k = k, ctx.v = v;
      ctx.core = {};
    }
  }
  context = context.view({s, b, core_np_ * hn_});
  if (cp_) context = tensor_parallel::all_to_all_hp2cp(*cp_, context);  // [s/cp, b, np/tp*hn]
  return m.ret(linear_proj_.forward(ctx.proj, context, opt.fp8_recompute));  // [s/cp(/tp), b, h]
}

Tensor SelfAttention::backward(SelfAttentionCtx& ctx, const Tensor& dy, const RopeTables* rope,
                               bool output_bias_grad_elsewhere) const {
  const ModuleScope m("self_attention", dy, ModuleScope::kBackward);
  Tensor dcontext = linear_proj_.backward(ctx.proj, dy, output_bias_grad_elsewhere);  // [s/cp, b, np/tp*hn]
  if (cp_) dcontext = tensor_parallel::all_to_all_cp2hp(*cp_, dcontext);               // [s, b, np/tp/cp*hn]
  const int64_t s = dcontext.size(0), b = dcontext.size(1);
  dcontext = dcontext.view({s, b, core_np_, hn_});
  Tensor dqkv;  // [s, b, ng/tp/cp*(np/ng+2)*hn]
  if (packed(rope)) {
    if (recompute_core_) {  // rebuild the core attention's context from the kept fused input
      core_->forward_qkv(ctx.core, ctx.fused_qkv, core_np_, core_ng_, ctx.core_replay.options());
      ctx.fused_qkv = Tensor();
    }
    const ModuleScope core_scope("core_attention", dcontext, ModuleScope::kBackward);
    dqkv = core_scope.ret(core_->backward_qkv(ctx.core, dcontext));
  } else {
    if (recompute_core_) {  // rebuild the core attention's context with the original dropout keys
      core_->forward(ctx.core, ctx.q, ctx.k, ctx.v, ctx.core_replay.options());
      ctx.q = ctx.k = ctx.v = Tensor();
    }
    CoreAttentionGrads g;
    {
      const ModuleScope core_scope("core_attention", dcontext, ModuleScope::kBackward);
      g = core_->backward(ctx.core, dcontext);
      core_scope.out(g.dq);
    }
    dqkv = Tensor::empty({s, b, (core_np_ + 2 * core_ng_) * hn_}, dy.dtype(), dy.device());
    if (rope && !q_layernorm_) {  // one pass
      Tensor dqkv_rows = rope_token_rows(dqkv, *rope);
      ops::qkv_merge_rope(dqkv_rows, rope_token_rows(g.dq, *rope), rope_token_rows(g.dk, *rope),
                          rope_token_rows(g.dv, *rope), rope->cos, rope->sin);
    } else {
      if (rope) {
        Tensor dqr = rope_token_rows(g.dq, *rope), dkr = rope_token_rows(g.dk, *rope);
        ops::rope_bwd(dqr, dqr, rope->cos, rope->sin);
        ops::rope_bwd(dkr, dkr, rope->cos, rope->sin);
      }
      if (q_layernorm_) {
        g.dq = q_layernorm_->backward(ctx.q_norm, g.dq);
        g.dk = k_layernorm_->backward(ctx.k_norm, g.dk);
        ctx.q_norm = {}, ctx.k_norm = {};
      }
      ops::qkv_merge(dqkv, g.dq, g.dk, g.dv);
    }
  }
  if (cp_) dqkv = tensor_parallel::all_to_all_hp2cp(*cp_, dqkv);  // [s/cp, b, ng/tp*(np/ng+2)*hn]
  return m.ret(linear_qkv_.backward(ctx.qkv, dqkv));               // [s/cp(/tp), b, h]
}

int64_t SelfAttention::saved_bytes(const TransformerConfig& m, const ActivationDims& d) {
  const bool flash = m.attention_impl == "flash";
  const int64_t qkv = d.n * (d.np + 2 * d.ng) * d.hn * d.e;
  const int64_t context = d.n * d.np * d.hn * d.e;  // the core's output = linear_proj's input
  // FP8: linear_proj keeps its casts and drops its input, which stays only where flash keeps it as its output
  const bool core_keeps_output = flash && !m.recomputes("core_attn");
  int64_t bytes = qkv + (d.fp8 && !core_keeps_output ? 0 : context);
  if (d.fp8) bytes += fp8_saved_bytes(d, d.n, d.np * d.hn, d.h);
  if (m.qk_layernorm)  // the norms keep the split q, k (the core the normalized ones)
    bytes += d.n * (d.np + d.ng) * (d.hn * d.e + 4 * (m.normalization == Normalization::LayerNorm ? 2 : 1));
  if (m.recomputes("core_attn")) return bytes;
  // all-to-all: flash keeps its output and linear_proj's input is its hp2cp copy (the ring's output is that input)
  if (d.cp > 1 && flash && !d.cp_ring && !d.fp8) bytes += context;
  if (flash) bytes += d.b * d.np * d.s * 4;  // lse (the packed and the split paths alike)
  else bytes += d.b * d.np * d.s * d.s * d.cp * 4;  // softmax probabilities (the unfused path is fp32)
  return bytes;
}

}  // namespace mcpp
