#include "mcpp/transformer/multi_latent_attention.h"

#include <algorithm>
#include <cmath>

#include "mcpp/core/error.h"
#include "mcpp/core/module_trace.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/tensor_parallel/mappings.h"
#include "mcpp/transformer/attention.h"

namespace mcpp {
namespace tp = tensor_parallel;

float mla_softmax_scale(const TransformerConfig& c) {
  const double m = yarn_get_mscale(c.rotary_scaling_factor, c.mscale_all_dim);
  return static_cast<float>(m * m / std::sqrt(static_cast<double>(c.qk_head_dim + c.qk_pos_emb_head_dim)));
}

namespace {
tp::ParallelLinearOptions column(const TransformerConfig& c, const tp::TPContext& t, int64_t in, int64_t out) {
  return {.input_size = in,
          .output_size = out,
          .bias = false,
          .init_std = c.init_method_std,
          .sequence_parallel = t.sequence_parallel,
          .tp_comm_overlap = t.comm_overlap};
}
}  // namespace

MLASelfAttention::MLASelfAttention(ParameterRegistry& params, const std::string& prefix, const TransformerConfig& c,
                                   const TransformerLayerSpec& spec, const tp::TPContext& t)
    : name_(prefix),
      n_(c.num_attention_heads / t.size()),
      dn_(c.qk_head_dim),
      dr_(c.qk_pos_emb_head_dim),
      dv_(c.v_head_dim),
      dc_(std::max(c.qk_head_dim + c.qk_pos_emb_head_dim, c.v_head_dim)),
      rq_(c.q_lora_rank),
      rkv_(c.kv_lora_rank),
      softmax_scale_(mla_softmax_scale(c)),
      tp_(t),
      linear_q_proj_(c.q_lora_rank == 0 ? std::make_optional<tp::ColumnParallelLinear>(
                                              params, prefix + ".linear_q_proj",
                                              column(c, t, c.hidden_size, c.num_attention_heads * (dn_ + dr_)), t.group)
                                        : std::nullopt),
      linear_q_down_proj_(c.q_lora_rank > 0 ? std::make_optional<tp::ColumnParallelLinear>(
                                                  params, prefix + ".linear_q_down_proj",
                                                  column(c, t, c.hidden_size, c.q_lora_rank), t.group)
                                            : std::nullopt),
      linear_q_up_proj_(c.q_lora_rank > 0 ? std::make_optional<tp::ColumnParallelLinear>(
                                                params, prefix + ".linear_q_up_proj",
                                                column(c, t, c.q_lora_rank, c.num_attention_heads * (dn_ + dr_)),
                                                t.group)
                                          : std::nullopt),
      linear_kv_down_proj_(params, prefix + ".linear_kv_down_proj",
                           column(c, t, c.hidden_size, c.kv_lora_rank + c.qk_pos_emb_head_dim), t.group),
      linear_kv_up_proj_(params, prefix + ".linear_kv_up_proj",
                         column(c, t, c.kv_lora_rank, c.num_attention_heads * (c.qk_head_dim + c.v_head_dim)),
                         t.group),
      linear_proj_(params, prefix + ".linear_proj", attention_output_options(c, spec, t, c.num_attention_heads * c.v_head_dim),
                   t.group),
      recompute_core_(c.recomputes("core_attn")),
      recompute_up_(c.recomputes("mla_up_proj")),
      cp_(t.cp && t.cp->size() > 1 && !t.cp_p2p ? t.cp : nullptr) {
  MCPP_CHECK(c.multi_latent_attention, "MLASelfAttention needs multi_latent_attention");
  if (c.qk_layernorm) {  // the latents' norms (Megatron's local spec builds them only with qk_layernorm)
    if (rq_ > 0)
      q_layernorm_.emplace(params, prefix + ".q_layernorm", rq_, c.normalization, c.norm_epsilon, t.sequence_parallel);
    kv_layernorm_.emplace(params, prefix + ".kv_layernorm", rkv_, c.normalization, c.norm_epsilon,
                          t.sequence_parallel);
  }
  const CoreAttentionOptions core_opt{.softmax_scale = softmax_scale_,
                                      .attention_dropout = c.attention_dropout,
                                      .causal = true,
                                      .deterministic = c.deterministic_mode};
  core_n_ = n_;
  if (t.cp_size() > 1 && t.cp_p2p) {  // ring attention: every head of this TP rank, this CP rank's rows
    core_ = spec.make_core_attention(core_opt, t);  // the spec's core builds the ring form under p2p
    return;
  }
  if (n_ % t.cp_size() != 0)
    fail("context parallelism (all-to-all) with multi-latent attention: num_attention_heads ({}) must be divisible by "
         "tensor_model_parallel_size * context_parallel_size ({})",
         c.num_attention_heads, t.size() * t.cp_size());
  core_n_ = n_ / t.cp_size();
  core_ = spec.make_core_attention(core_opt, t);
}

Tensor MLASelfAttention::to_core(const Tensor& x) const {
  if (!cp_) return x;
  const int64_t s = x.size(0), b = x.size(1);
  return tp::all_to_all_cp2hp(*cp_, x.view({s, b, n_ * dc_})).view({s * cp_->size(), b, core_n_, dc_});
}

Tensor MLASelfAttention::from_core(const Tensor& x) const {
  if (!cp_) return x;
  const int64_t s = x.size(0), b = x.size(1);
  return tp::all_to_all_hp2cp(*cp_, x.view({s, b, core_n_ * dc_})).view({s / cp_->size(), b, n_, dc_});
}

namespace {
// ops::mla_qkv_fwd with the rotary tables' rows: per position, or per token (rope.h's [s*b, 1] views) for packed
// sequences and a KV-cache decode step (tables of one row per sequence at its position).
void mla_qkv_rows(Tensor& query, Tensor& key, Tensor& value, const Tensor& q, const Tensor& kv, const Tensor& latent,
                  const RopeTables& rope) {
  Tensor qr = rope_token_rows(query, rope), kr = rope_token_rows(key, rope), vr = rope_token_rows(value, rope);
  ops::mla_qkv_fwd(qr, kr, vr, rope_token_rows(q, rope), rope_token_rows(kv, rope), rope_token_rows(latent, rope),
                   rope.cos, rope.sin);
}
}  // namespace

Tensor MLASelfAttention::forward(MLASelfAttentionCtx& ctx, const Tensor& x, const RopeTables* rope,
                                 const ForwardOptions& opt) const {
  MCPP_CHECK(rope && rope->cos.defined() && rope->cos.size(1) * 2 == dr_,
             "MLASelfAttention: needs the model's MLA rotary tables over qk_pos_emb_head_dim = {} channels", dr_);
  const ModuleScope m("self_attention", x);
  comm::Communicator& g = *tp_.group;
  // Queries [s, b, n/tp * (dn + dr)].
  Tensor q;
  if (rq_ > 0) {
    Tensor qc = tp::all_gather_last_dim(g, linear_q_down_proj_->forward(ctx.q_down, x));  // [s, b, rq]
    if (tp_.sequence_parallel) qc = tp::split_sp(g, qc).clone();                          // [s/tp, b, rq]
    if (q_layernorm_) qc = q_layernorm_->forward(ctx.q_norm, qc);
    q = linear_q_up_proj_->forward(ctx.q_up, qc);
  } else {
    q = linear_q_proj_->forward(ctx.q_up, x);
  }
  // The key / value latent [s, b, rkv + dr] and its first rkv channels.
  const Tensor latent = tp::all_gather_last_dim(g, linear_kv_down_proj_.forward(ctx.kv_down, x));
  const int64_t s = latent.size(0), b = latent.size(1);
  Tensor kvc = Tensor::empty({s, b, rkv_}, latent.dtype(), latent.device());
  ops::copy_columns(kvc, latent, 0, 0, rkv_);
  if (tp_.sequence_parallel) kvc = tp::split_sp(g, kvc).clone();  // [s/tp, b, rkv]
  if (kv_layernorm_) kvc = kv_layernorm_->forward(ctx.kv_norm, kvc);
  const Tensor kv = linear_kv_up_proj_.forward(ctx.kv_up, kvc);  // [s, b, n/tp * (dn + dv)]
  const DType dt = q.dtype();
  const Device dev = q.device();
  Tensor query = Tensor::empty({s, b, n_, dc_}, dt, dev), key = Tensor::empty({s, b, n_, dc_}, dt, dev),
         value = Tensor::empty({s, b, n_, dc_}, dt, dev);
  mla_qkv_rows(query, key, value, q.view({s, b, n_, dn_ + dr_}), kv.view({s, b, n_, dn_ + dv_}), latent, *rope);
  if (opt.inference) {  // the cached core attention (the full keys / values after the up-projections)
    MCPP_CHECK(!cp_ && core_n_ == n_, "{}: generation with a KV cache runs without context parallelism", name_);
    Tensor context = opt.inference->attend(name_, *core_, ctx.core, query, key, value, softmax_scale_);
    return m.ret(project_context(ctx, context));
  }
  if (recompute_core_) ctx.core_replay = ForwardReplay::of(opt);
  query = to_core(query), key = to_core(key), value = to_core(value);  // (a2a: the whole sequence, n/tp/cp heads)
  Tensor context = from_core(core_->forward(ctx.core, query, key, value, opt));  // [s, b, n/tp, dc]
  if (recompute_up_) {  // "mla_up_proj": keep the shared rotary key's input instead of query / key / value
    ctx.k_pe = Tensor::empty({s, b, dr_}, latent.dtype(), latent.device());
    ops::copy_columns(ctx.k_pe, latent, 0, rkv_, dr_);
    core_->release_inputs(ctx.core);
  }
  if (recompute_core_) {  // "core_attn": keep the inputs (unless rebuilt from the up projections), drop the core's state
    if (!recompute_up_) ctx.query = query, ctx.key = key, ctx.value = value;
    ctx.core = {};
  }
  return m.ret(project_context(ctx, context));
}

Tensor MLASelfAttention::project_context(MLASelfAttentionCtx& ctx, Tensor context) const {
  const int64_t s = context.size(0), b = context.size(1);
  if (dc_ != dv_) {  // the value channels of the padded heads
    Tensor c2 = Tensor::empty({s, b, n_, dv_}, context.dtype(), context.device());
    ops::copy_columns(c2, context, 0, 0, dv_);
    context = c2;
  }
  return linear_proj_.forward(ctx.proj, context.view({s, b, n_ * dv_}));  // [s(/tp), b, h]
}

Tensor MLASelfAttention::backward(MLASelfAttentionCtx& ctx, const Tensor& dy, const RopeTables* rope,
                                  bool output_bias_grad_elsewhere) const {
  const ModuleScope m("self_attention", dy, ModuleScope::kBackward);
  comm::Communicator& g = *tp_.group;
  Tensor dcontext = linear_proj_.backward(ctx.proj, dy, output_bias_grad_elsewhere);  // [s, b, n/tp * dv]
  const int64_t s = dcontext.size(0), b = dcontext.size(1);
  const DType dt = dcontext.dtype();
  const Device dev = dcontext.device();
  if (dc_ != dv_) {  // zero gradient for the padding channels
    Tensor padded = Tensor::zeros({s, b, n_, dc_}, dt, dev);
    ops::copy_columns(padded, dcontext.view({s, b, n_, dv_}), 0, 0, dv_);
    dcontext = padded;
  }
  if (recompute_up_) {  // rebuild query / key / value: the up projections' GEMMs and the RoPE again
    const Tensor q = (rq_ > 0 ? *linear_q_up_proj_ : *linear_q_proj_).recompute_output(ctx.q_up);
    const Tensor kv = linear_kv_up_proj_.recompute_output(ctx.kv_up);
    Tensor query = Tensor::empty({s, b, n_, dc_}, dt, dev), key = Tensor::empty({s, b, n_, dc_}, dt, dev),
           value = Tensor::empty({s, b, n_, dc_}, dt, dev);
    mla_qkv_rows(query, key, value, q.view({s, b, n_, dn_ + dr_}), kv.view({s, b, n_, dn_ + dv_}), ctx.k_pe, *rope);
    query = to_core(query), key = to_core(key), value = to_core(value);  // (a2a: again the core's layout)
    ctx.k_pe = Tensor();
    if (recompute_core_) ctx.query = query, ctx.key = key, ctx.value = value;
    else core_->restore_inputs(ctx.core, query, key, value);
  }
  if (recompute_core_) {  // rebuild the core attention's context with the original dropout keys
    core_->forward(ctx.core, ctx.query, ctx.key, ctx.value, ctx.core_replay.options());
    ctx.query = ctx.key = ctx.value = Tensor();
  }
  CoreAttentionGrads gr = core_->backward(ctx.core, to_core(dcontext.view({s, b, n_, dc_})));
  ctx.core = {};
  gr.dq = from_core(gr.dq), gr.dk = from_core(gr.dk), gr.dv = from_core(gr.dv);  // this rank's rows again
  Tensor dq = Tensor::empty({s, b, n_ * (dn_ + dr_)}, dt, dev), dkv = Tensor::empty({s, b, n_ * (dn_ + dv_)}, dt, dev),
         dk_pe = Tensor::empty({s, b, dr_}, dt, dev);
  Tensor dq4 = dq.view({s, b, n_, dn_ + dr_}), dkv4 = dkv.view({s, b, n_, dn_ + dv_});
  {  // (per-token tables of packed sequences: [s*b, 1, ..] views, rope.h)
    Tensor dq_rows = rope_token_rows(dq4, *rope), dkv_rows = rope_token_rows(dkv4, *rope),
           dk_pe_rows = rope_token_rows(dk_pe, *rope);
    ops::mla_qkv_bwd(dq_rows, dkv_rows, dk_pe_rows, rope_token_rows(gr.dq, *rope), rope_token_rows(gr.dk, *rope),
                     rope_token_rows(gr.dv, *rope), rope->cos, rope->sin);
  }
  gr = {};
  // The shared rotary key: every TP rank's heads contributed (see the header).
  if (g.size() > 1) tp::all_reduce_tp(g, dk_pe);
  // Keys / values back to the latent [s, b, rkv + dr].
  Tensor dkvc = linear_kv_up_proj_.backward(ctx.kv_up, dkv);  // [s(/tp), b, rkv]
  if (kv_layernorm_) dkvc = kv_layernorm_->backward(ctx.kv_norm, dkvc);
  if (tp_.sequence_parallel) dkvc = tp::all_gather_sp(g, dkvc);  // scatter_to_sp backward: [s, b, rkv]
  Tensor dlatent = Tensor::empty({s, b, rkv_ + dr_}, dt, dev);
  ops::copy_columns(dlatent, dkvc, 0, 0, rkv_);
  ops::copy_columns(dlatent, dk_pe, rkv_, 0, dr_);
  Tensor dx = linear_kv_down_proj_.backward(ctx.kv_down, tp::split_last_dim(g, dlatent));  // [s(/tp), b, h]
  // Queries.
  Tensor dxq;
  if (rq_ > 0) {
    Tensor dqc = linear_q_up_proj_->backward(ctx.q_up, dq);  // [s(/tp), b, rq]
    if (q_layernorm_) dqc = q_layernorm_->backward(ctx.q_norm, dqc);
    if (tp_.sequence_parallel) dqc = tp::all_gather_sp(g, dqc);  // [s, b, rq]
    dxq = linear_q_down_proj_->backward(ctx.q_down, tp::split_last_dim(g, dqc));
  } else {
    dxq = linear_q_proj_->backward(ctx.q_up, dq);
  }
  ops::add_inplace(dx, dxq);
  ctx.q_norm = {}, ctx.kv_norm = {};
  return m.ret(dx);
}

void MLASelfAttention::release_input(MLASelfAttentionCtx& ctx) const {
  ctx.kv_down.x = Tensor();
  (rq_ > 0 ? ctx.q_down : ctx.q_up).x = Tensor();
}

void MLASelfAttention::restore_input(MLASelfAttentionCtx& ctx, const Tensor& x) const {
  linear_kv_down_proj_.restore_input(ctx.kv_down, x);
  if (rq_ > 0) linear_q_down_proj_->restore_input(ctx.q_down, x);
  else linear_q_proj_->restore_input(ctx.q_up, x);
}

int64_t MLASelfAttention::saved_bytes(const TransformerConfig& m, const ActivationDims& d, int64_t norm_out) {
  const bool flash = m.attention_impl == "flash", selective = m.recomputes("core_attn");
  const int64_t dc = std::max(m.qk_head_dim + m.qk_pos_emb_head_dim, m.v_head_dim);
  const int64_t stats = 4 * (m.normalization == Normalization::LayerNorm ? 2 : 1);
  const auto latent = [&](int64_t r) {  // a latent of width r: its norm's input and statistics, the up proj's input
    return (m.qk_layernorm ? d.n_local * (r * d.e + stats) : 0) + d.n * r * d.e;
  };
  int64_t bytes = (d.sequence_parallel() ? norm_out * d.n * d.h * d.e : 0)  // the second down projection's input
                  + (m.q_lora_rank > 0 ? latent(m.q_lora_rank) : 0) + latent(m.kv_lora_rank);
  // linear_proj's input; under FP8 (linear_proj only: the projections into and out of the latents stay in the model's
  // dtype) its casts, the input dropped where flash does not keep it as its own output
  const bool flash_output_is_proj_input = flash && !selective && dc == m.v_head_dim && !(d.cp > 1 && !d.cp_ring);
  if (!d.fp8 || flash_output_is_proj_input) bytes += d.n * d.np * m.v_head_dim * d.e;
  if (d.fp8) bytes += fp8_saved_bytes(d, d.n, d.np * m.v_head_dim, d.h);
  if (m.recomputes("mla_up_proj")) bytes += d.n * m.qk_pos_emb_head_dim * d.e;  // k_pe (query / key / value rebuilt)
  else bytes += 3 * d.n * d.np * dc * d.e;                                        // query, key, value
  if (!selective) {
    // flash keeps its output: linear_proj's input itself unless the heads are padded (then its value channels'
    // copy is) or the all-to-all form brings it back (hp2cp: a copy); the ring's output is as flash's
    const bool a2a = d.cp > 1 && !d.cp_ring;
    if (flash && (dc != m.v_head_dim || a2a)) bytes += d.n * d.np * dc * d.e;
    if (flash) bytes += d.b * d.np * d.s * 4;         // lse
    else bytes += d.b * d.np * d.s * d.s * d.cp * 4;  // softmax probabilities (fp32; a2a: the whole rows)
  }
  return bytes;
}

}  // namespace mcpp
