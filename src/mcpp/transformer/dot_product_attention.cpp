#include "mcpp/transformer/dot_product_attention.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {
namespace {

// The document mask of this forward (packed sequences), or undefined.
Tensor doc_start_of(const ForwardOptions& fopt) {
  return fopt.packed_seq_params ? fopt.packed_seq_params->doc_start : Tensor();
}

class FlashAttention final : public CoreAttention {
 public:
  explicit FlashAttention(const CoreAttentionOptions& opt) : opt_(opt) {}

  Tensor forward(CoreAttentionCtx& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                 const ForwardOptions& fopt) const override {
    const int64_t s = q.size(0), b = q.size(1), np = q.size(2);
    ctx.q = q;
    ctx.k = k;
    ctx.v = v;
    ctx.doc_start = doc_start_of(fopt);
    draw_dropout_key(ctx, fopt, b, np, s);
    ctx.out = Tensor::empty(q.shape(), q.dtype(), q.device());        // [s, b, np, hn]
    ctx.lse = Tensor::empty({b, np, s}, DType::F32, q.device());       // [b, np, s]
    ops::flash_attention_fwd(ctx.out, ctx.lse, q, k, v, attention_options(ctx));
    return ctx.out;
  }

  CoreAttentionGrads backward(CoreAttentionCtx& ctx, const Tensor& dout) const override {
    CoreAttentionGrads g{Tensor::empty(ctx.q.shape(), dout.dtype(), dout.device()),
                         Tensor::empty(ctx.k.shape(), dout.dtype(), dout.device()),
                         Tensor::empty(ctx.v.shape(), dout.dtype(), dout.device())};
    ops::flash_attention_bwd(g.dq, g.dk, g.dv, dout, ctx.q, ctx.k, ctx.v, ctx.out, ctx.lse, attention_options(ctx));
    return g;
  }

  void release_inputs(CoreAttentionCtx& ctx) const override { ctx.q = ctx.k = ctx.v = Tensor(); }
  void restore_inputs(CoreAttentionCtx& ctx, const Tensor& q, const Tensor& k, const Tensor& v) const override {
    ctx.q = q, ctx.k = k, ctx.v = v;
  }

  bool supports_packed_qkv() const override { return true; }

  Tensor forward_qkv(CoreAttentionCtx& ctx, const Tensor& qkv, int64_t np, int64_t ng,
                     const ForwardOptions& fopt) const override {
    MCPP_CHECK(qkv.ndim() == 3 && np > 0 && ng > 0 && qkv.size(2) % (np + 2 * ng) == 0,
               "flash attention: packed qkv must be [s, b, (np + 2 ng) hn] with np={} ng={}; got {}", np, ng,
               qkv.str());
    const int64_t s = qkv.size(0), b = qkv.size(1), hn = qkv.size(2) / (np + 2 * ng);
    ctx.qkv = qkv;
    ctx.num_query_groups = ng;
    ctx.doc_start = doc_start_of(fopt);
    draw_dropout_key(ctx, fopt, b, np, s);
    ctx.out = Tensor::empty({s, b, np, hn}, qkv.dtype(), qkv.device());  // [s, b, np, hn]
    ctx.lse = Tensor::empty({b, np, s}, DType::F32, qkv.device());       // [b, np, s]
    ops::flash_attention_fwd_qkv(ctx.out, ctx.lse, qkv, ng, attention_options(ctx));
    return ctx.out;
  }

  Tensor backward_qkv(CoreAttentionCtx& ctx, const Tensor& dout) const override {
    Tensor dqkv = Tensor::empty(ctx.qkv.shape(), dout.dtype(), dout.device());  // [s, b, ng*(np/ng+2)*hn]
    ops::flash_attention_bwd_qkv(dqkv, dout, ctx.qkv, ctx.out, ctx.lse, ctx.num_query_groups,
                                 attention_options(ctx));
    return dqkv;
  }

 private:
  // The same draw as the unfused path's dropout on its [b * np, s, s] probs (the model-parallel stream:
  // local heads differ across TP ranks), so both paths use one mask and leave the stream at one offset.
  void draw_dropout_key(CoreAttentionCtx& ctx, const ForwardOptions& fopt, int64_t b, int64_t np, int64_t s) const {
    ctx.dropout = dropout_active(fopt, opt_.attention_dropout);
    if (!ctx.dropout) return;
    MCPP_CHECK(fopt.rng, "attention dropout needs an RNG stream");
    ctx.dropout_key = fopt.rng->draw_model_parallel(static_cast<uint64_t>(b * np * s * s));
  }
  ops::AttentionOptions attention_options(const CoreAttentionCtx& ctx) const {
    return {.softmax_scale = opt_.softmax_scale,
            .causal = opt_.causal,
            .deterministic = opt_.deterministic,
            .dropout_p = ctx.dropout ? opt_.attention_dropout : 0.0f,
            .dropout_key = ctx.dropout_key,
            .doc_start = ctx.doc_start};
  }
  CoreAttentionOptions opt_;
};

// [s, b, n, hn] <-> [b, n, s, hn] (host copies: the unfused path is the CPU reference implementation).
Tensor to_head_major(const Tensor& x) {
  MCPP_CHECK(x.is_cpu(), "unfused attention runs on CPU tensors (use attention_impl=flash on CUDA)");
  const int64_t s = x.size(0), b = x.size(1), n = x.size(2), d = x.size(3);
  Tensor y = Tensor::empty({b, n, s, d});
  const float* src = x.data<float>();
  float* dst = y.data<float>();
  for (int64_t is = 0; is < s; ++is)
    for (int64_t ib = 0; ib < b; ++ib)
      for (int64_t in = 0; in < n; ++in)
        std::memcpy(dst + ((ib * n + in) * s + is) * d, src + ((is * b + ib) * n + in) * d, sizeof(float) * d);
  return y;
}

Tensor from_head_major(const Tensor& y) {
  const int64_t b = y.size(0), n = y.size(1), s = y.size(2), d = y.size(3);
  Tensor x = Tensor::empty({s, b, n, d});
  const float* src = y.data<float>();
  float* dst = x.data<float>();
  for (int64_t is = 0; is < s; ++is)
    for (int64_t ib = 0; ib < b; ++ib)
      for (int64_t in = 0; in < n; ++in)
        std::memcpy(dst + ((is * b + ib) * n + in) * d, src + ((ib * n + in) * s + is) * d, sizeof(float) * d);
  return x;
}

class UnfusedAttention final : public CoreAttention {
 public:
  explicit UnfusedAttention(const CoreAttentionOptions& opt) : opt_(opt) {}

  Tensor forward(CoreAttentionCtx& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                 const ForwardOptions& fopt) const override {
    const int64_t s = q.size(0), b = q.size(1), np = q.size(2), ng = k.size(2), hn = q.size(3);
    const int64_t rep = np / ng;
    ctx.q = to_head_major(q);  // [b, np, s, hn]
    ctx.k = to_head_major(k);  // [b, ng, s, hn]
    ctx.v = to_head_major(v);  // [b, ng, s, hn]
    Tensor scores = Tensor::empty({b * np, s, s});  // [b*np, sq, sk]
    for (int64_t ib = 0; ib < b; ++ib)
      for (int64_t h = 0; h < np; ++h) {
        Tensor sc = scores.narrow0(ib * np + h, 1).view({s, s});
        ops::gemm(sc, head(ctx.q, ib, h), head(ctx.k, ib, h / rep), {.trans_b = true});
      }
    ctx.doc_start = doc_start_of(fopt);
    if (ctx.doc_start.defined()) mask_documents(scores, ctx.doc_start.to(Device::CPU), np);
    ctx.probs = Tensor::empty(scores.shape());
    ops::scaled_masked_softmax_fwd(ctx.probs, scores, opt_.softmax_scale, opt_.causal);
    Tensor probs = ctx.probs;
    ctx.dropout = dropout_active(fopt, opt_.attention_dropout);
    if (ctx.dropout) {
      MCPP_CHECK(fopt.rng, "attention dropout needs an RNG stream");
      ctx.dropout_key = fopt.rng->draw_model_parallel(static_cast<uint64_t>(ctx.probs.numel()));  // local heads
      probs = Tensor::empty(ctx.probs.shape());
      ops::dropout_fwd(probs, ctx.probs, opt_.attention_dropout, ctx.dropout_key);
    }
    Tensor out = Tensor::empty({b, np, s, hn});
    for (int64_t ib = 0; ib < b; ++ib)
      for (int64_t h = 0; h < np; ++h) {
        Tensor o = head(out, ib, h);
        ops::gemm(o, probs.narrow0(ib * np + h, 1).view({s, s}), head(ctx.v, ib, h / rep), {});
      }
    return from_head_major(out);  // [s, b, np, hn]
  }

  void release_inputs(CoreAttentionCtx& ctx) const override { ctx.q = ctx.k = ctx.v = Tensor(); }
  void restore_inputs(CoreAttentionCtx& ctx, const Tensor& q, const Tensor& k, const Tensor& v) const override {
    ctx.q = to_head_major(q), ctx.k = to_head_major(k), ctx.v = to_head_major(v);  // as forward keeps them
  }

  CoreAttentionGrads backward(CoreAttentionCtx& ctx, const Tensor& dout_sbnd) const override {
    const int64_t b = ctx.q.size(0), np = ctx.q.size(1), s = ctx.q.size(2), hn = ctx.q.size(3);
    const int64_t ng = ctx.k.size(1), rep = np / ng;
    Tensor dout = to_head_major(dout_sbnd);  // [b, np, s, hn]
    Tensor probs = ctx.probs;
    if (ctx.dropout) {
      probs = Tensor::empty(ctx.probs.shape());
      ops::dropout_fwd(probs, ctx.probs, opt_.attention_dropout, ctx.dropout_key);  // same mask again
    }
    Tensor dprobs = Tensor::empty(probs.shape());  // [b*np, s, s]
    Tensor dq = Tensor::empty({b, np, s, hn});
    Tensor dk = Tensor::zeros({b, ng, s, hn});
    Tensor dv = Tensor::zeros({b, ng, s, hn});
    for (int64_t ib = 0; ib < b; ++ib)
      for (int64_t h = 0; h < np; ++h) {
        Tensor dp = dprobs.narrow0(ib * np + h, 1).view({s, s});
        ops::gemm(dp, head(dout, ib, h), head(ctx.v, ib, h / rep), {.trans_b = true});  // dP = dO V^T
        Tensor dvh = head(dv, ib, h / rep);
        ops::gemm(dvh, probs.narrow0(ib * np + h, 1).view({s, s}), head(dout, ib, h),
                  {.trans_a = true, .beta = 1.0f});  // dV += P^T dO (summed over the group's heads)
      }
    if (ctx.dropout) ops::dropout_bwd(dprobs, dprobs, opt_.attention_dropout, ctx.dropout_key);
    Tensor dscores = Tensor::empty(dprobs.shape());
    ops::scaled_masked_softmax_bwd(dscores, dprobs, ctx.probs, opt_.softmax_scale);  // includes the scale
    for (int64_t ib = 0; ib < b; ++ib)
      for (int64_t h = 0; h < np; ++h) {
        Tensor ds = dscores.narrow0(ib * np + h, 1).view({s, s});
        Tensor dqh = head(dq, ib, h);
        ops::gemm(dqh, ds, head(ctx.k, ib, h / rep), {});  // dQ = dS K
        Tensor dkh = head(dk, ib, h / rep);
        ops::gemm(dkh, ds, head(ctx.q, ib, h), {.trans_a = true, .beta = 1.0f});  // dK += dS^T Q
      }
    return {from_head_major(dq), from_head_major(dk), from_head_major(dv)};
  }

 private:
  // scores [b*np, s, s]: -inf where key j precedes query i's document (doc_start [b, s]); the softmax gives them 0
  // and its backward a 0 gradient.
  static void mask_documents(Tensor& scores, const Tensor& doc_start, int64_t np) {
    const int64_t s = scores.size(1), b = scores.size(0) / np;
    MCPP_CHECK(doc_start.dtype() == DType::I32 && doc_start.shape() == Shape({b, s}),
               "unfused attention: doc_start must be int32 [b={}, s={}]; got {}", b, s, doc_start.str());
    for (int64_t r = 0; r < b * np; ++r)
      for (int64_t i = 0; i < s; ++i) {
        const int32_t first = doc_start.data<int32_t>()[(r / np) * s + i];
        std::fill_n(scores.data<float>() + (r * s + i) * s, std::min<int64_t>(first, s),
                    -std::numeric_limits<float>::infinity());
      }
  }
  // The [s, hn] matrix of head h of batch row ib in a head-major [b, n, s, hn] tensor.
  static Tensor head(const Tensor& t, int64_t ib, int64_t h) {
    const int64_t n = t.size(1), s = t.size(2), hn = t.size(3);
    return t.flat_slice((ib * n + h) * s * hn, {s, hn});
  }
  CoreAttentionOptions opt_;
};

}  // namespace

void CoreAttention::release_inputs(CoreAttentionCtx&) const {
  fail("this core attention cannot release its kept inputs (recompute of its inputs: flash, unfused or ring only)");
}
void CoreAttention::restore_inputs(CoreAttentionCtx&, const Tensor&, const Tensor&, const Tensor&) const {
  fail("this core attention cannot restore its kept inputs (recompute of its inputs: flash, unfused or ring only)");
}
Tensor CoreAttention::forward_qkv(CoreAttentionCtx&, const Tensor&, int64_t, int64_t, const ForwardOptions&) const {
  fail("this core attention does not take the packed qkv (supports_packed_qkv() is false); split q, k, v first");
}
Tensor CoreAttention::backward_qkv(CoreAttentionCtx&, const Tensor&) const {
  fail("this core attention does not take the packed qkv (supports_packed_qkv() is false); split q, k, v first");
}

std::unique_ptr<CoreAttention> make_flash_attention(const CoreAttentionOptions& opt) {
  return std::make_unique<FlashAttention>(opt);
}
std::unique_ptr<CoreAttention> make_unfused_attention(const CoreAttentionOptions& opt) {
  return std::make_unique<UnfusedAttention>(opt);
}

}  // namespace mcpp
