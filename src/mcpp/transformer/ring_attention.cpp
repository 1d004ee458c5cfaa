#include "mcpp/transformer/ring_attention.h"

#include "mcpp/core/error.h"

namespace mcpp {
namespace {
constexpr int kTagK = 0, kTagV = 1, kTagDk = 2, kTagDv = 3;  // the ring's message channels (P2POp::tag)
}  // namespace

namespace ring_attention {
namespace {

Tensor half(const Tensor& t, int h) {  // rows [h c, (h + 1) c) of [2c, ...] (a view)
  return t.narrow0(h * (t.size(0) / 2), t.size(0) / 2);
}
Tensor lse_half(const Tensor& lse, int h) {  // [b, np, c] of lse [2, b, np, c] (a view)
  return lse.narrow0(h, 1).view({lse.size(1), lse.size(2), lse.size(3)});
}

void check_step(int step, int rank, int cp) {
  MCPP_CHECK(cp >= 1 && rank >= 0 && rank < cp && step >= 0 && step < cp, "ring attention: step {} at rank {} of {}",
             step, rank, cp);
}

// A block's options: its causal flag, and with attention dropout its place in the whole sequence's mask (query
// chunk rows x key chunk columns of S = 2 cp c), so every block draws the unsplit attention's mask.
ops::AttentionOptions block_options(const ops::AttentionOptions& opt, const Block& blk, int step, int rank, int cp,
                                    int64_t c) {
  ops::AttentionOptions o = opt;
  o.causal = blk.causal;
  if (opt.dropout_p > 0.0f) {
    const int j = ((rank - step) % cp + cp) % cp;
    const int64_t q_chunk = blk.q_half == 0 ? rank : 2 * cp - 1 - rank, k_chunk = blk.k_half == 0 ? j : 2 * cp - 1 - j;
    o.dropout_seq_length = 2 * cp * c;
    o.dropout_row_offset = q_chunk * c;
    o.dropout_col_offset = k_chunk * c;
  }
  return o;
}

void check_rows(const char* what, const Tensor& q, const Tensor& k) {
  MCPP_CHECK(q.ndim() == 4 && q.size(0) % 2 == 0 && k.ndim() == 4 && k.size(0) == q.size(0),
             "ring attention {}: q [2c, b, np, d] and k / v [2c, b, ng, d] over the same rows; got {} and {}", what,
             q.str(), k.str());
}

}  // namespace

std::vector<Block> blocks(int step, int rank, int cp) {
  check_step(step, rank, cp);
  const int j = ((rank - step) % cp + cp) % cp;  // whose keys arrive at this step
  if (j == rank) return {{0, 0, true}, {1, 0, false}, {1, 1, true}};
  if (j < rank) return {{0, 0, false}, {1, 0, false}};
  return {{1, 0, false}, {1, 1, false}};
}

void forward_step(Tensor& o_acc, Tensor& lse_acc, const Tensor& q, const Tensor& k, const Tensor& v, int step,
                  int rank, int cp, const ops::AttentionOptions& opt) {
  check_rows("forward", q, k);
  const int64_t c = q.size(0) / 2, b = q.size(1), np = q.size(2);
  MCPP_CHECK(o_acc.shape() == q.shape() && o_acc.dtype() == DType::F32 && lse_acc.shape() == Shape({2, b, np, c}),
             "ring attention forward: o_acc float32 {} and lse_acc [2, {}, {}, {}]; got {} and {}",
             shape_str(q.shape()), b, np, c, o_acc.str(), lse_acc.str());
  Tensor o_blk = Tensor::empty({c, b, np, q.size(3)}, q.dtype(), q.device());
  Tensor lse_blk = Tensor::empty({b, np, c}, DType::F32, q.device());
  bool written[2] = {false, false};
  for (const Block& blk : blocks(step, rank, cp)) {
    const ops::AttentionOptions o = block_options(opt, blk, step, rank, cp, c);
    Tensor acc = half(o_acc, blk.q_half);
    Tensor lse = lse_half(lse_acc, blk.q_half);
    if (step == 0 && !written[blk.q_half]) {  // the half's first pair writes the accumulators
      ops::flash_attention_fwd(o_blk, lse, half(q, blk.q_half), half(k, blk.k_half), half(v, blk.k_half), o);
      ops::cast(acc, o_blk);
      written[blk.q_half] = true;
      continue;
    }
    ops::flash_attention_fwd(o_blk, lse_blk, half(q, blk.q_half), half(k, blk.k_half), half(v, blk.k_half), o);
    ops::attention_merge(acc, lse, o_blk, lse_blk);
  }
}

void backward_step(Tensor& dq_acc, Tensor& dk_acc, Tensor& dv_acc, const Tensor& dout, const Tensor& q,
                   const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, int step, int rank, int cp,
                   const ops::AttentionOptions& opt) {
  check_rows("backward", q, k);
  const int64_t c = q.size(0) / 2;
  Tensor dq = Tensor::empty({c, q.size(1), q.size(2), q.size(3)}, dout.dtype(), dout.device());
  Tensor dk = Tensor::empty({c, k.size(1), k.size(2), k.size(3)}, dout.dtype(), dout.device());
  Tensor dv = Tensor::empty(dk.shape(), dout.dtype(), dout.device());
  for (const Block& blk : blocks(step, rank, cp)) {
    const ops::AttentionOptions o = block_options(opt, blk, step, rank, cp, c);
    ops::flash_attention_bwd(dq, dk, dv, half(dout, blk.q_half), half(q, blk.q_half), half(k, blk.k_half),
                             half(v, blk.k_half), half(out, blk.q_half), lse_half(lse, blk.q_half), o);
    Tensor dq_h = half(dq_acc, blk.q_half), dk_h = half(dk_acc, blk.k_half), dv_h = half(dv_acc, blk.k_half);
    ops::add_inplace(dq_h, dq);
    ops::add_inplace(dk_h, dk);
    ops::add_inplace(dv_h, dv);
  }
}

}  // namespace ring_attention

namespace {

class RingAttention final : public CoreAttention {
 public:
  RingAttention(const CoreAttentionOptions& opt, comm::CommPtr cp) : opt_(opt), cp_(std::move(cp)) {
    MCPP_CHECK(cp_ && cp_->size() > 1, "ring attention needs a context-parallel group of more than one rank");
    MCPP_CHECK(opt_.causal, "ring attention: only causal attention is implemented (its blocks assume the mask)");
  }

  Tensor forward(CoreAttentionCtx& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                 const ForwardOptions& fopt) const override {
    MCPP_CHECK(!fopt.packed_seq_params || !fopt.packed_seq_params->doc_start.defined(),
               "ring attention: packed sequences' document masking is not implemented with context parallelism");
    const int cp = cp_->size(), r = cp_->rank();
    const int64_t b = q.size(1), np = q.size(2), c = q.size(0) / 2;
    ctx.q = q, ctx.k = k, ctx.v = v;
    ctx.dropout = dropout_active(fopt, opt_.attention_dropout);
    if (ctx.dropout) {  // the unsplit attention's draw (its [b, np, S, S] mask): the same key on every CP rank
      MCPP_CHECK(fopt.rng, "attention dropout needs an RNG stream");
      const auto big_s = static_cast<uint64_t>(2 * cp * c);
      ctx.dropout_key = fopt.rng->draw_model_parallel(static_cast<uint64_t>(b * np) * big_s * big_s);
    }
    Tensor o_acc = Tensor::empty(q.shape(), DType::F32, q.device());
    ctx.lse = Tensor::empty({2, b, np, c}, DType::F32, q.device());
    Tensor kb = k, vb = v;
    for (int i = 0; i < cp; ++i) {
      Tensor kn, vn;
      comm::Work w;
      if (i + 1 < cp) {  // the next block, in flight under this one's math
        kn = Tensor::empty(k.shape(), k.dtype(), k.device());
        vn = Tensor::empty(v.shape(), v.dtype(), v.device());
        w = exchange(kb, vb, kn, vn, kTagK, kTagV);
      }
      ring_attention::forward_step(o_acc, ctx.lse, q, kb, vb, i, r, cp, options(ctx));
      w.wait();
      kb = kn, vb = vn;
    }
    ctx.out = Tensor::empty(q.shape(), q.dtype(), q.device());
    ops::cast(ctx.out, o_acc);
    return ctx.out;
  }

  void release_inputs(CoreAttentionCtx& ctx) const override { ctx.q = ctx.k = ctx.v = Tensor(); }
  void restore_inputs(CoreAttentionCtx& ctx, const Tensor& q, const Tensor& k, const Tensor& v) const override {
    ctx.q = q, ctx.k = k, ctx.v = v;  // (as forward keeps them)
  }

  CoreAttentionGrads backward(CoreAttentionCtx& ctx, const Tensor& dout) const override {
    const int cp = cp_->size(), r = cp_->rank();
    const Device dev = dout.device();
    Tensor dq_acc = Tensor::zeros(ctx.q.shape(), DType::F32, dev);
    Tensor kb = ctx.k, vb = ctx.v;
    // dk / dv of the block held: this rank's share is computed into a fresh buffer while the share of the ranks
    // before it (dk_in / dv_in) is in flight; the sum goes on to the next rank under the next block's math. After
    // the last step each rank receives its own block's, every rank's share summed.
    Tensor dk_in, dv_in, dk_sent, dv_sent;  // the sent buffers stay alive until their transfer completes
    comm::Work wd;
    for (int i = 0; i < cp; ++i) {
      Tensor kn, vn;
      comm::Work w;
      if (i + 1 < cp) {
        kn = Tensor::empty(kb.shape(), kb.dtype(), dev);
        vn = Tensor::empty(vb.shape(), vb.dtype(), dev);
        w = exchange(kb, vb, kn, vn, kTagK, kTagV);
      }
      Tensor dk_acc = Tensor::zeros(ctx.k.shape(), DType::F32, dev);
      Tensor dv_acc = Tensor::zeros(ctx.v.shape(), DType::F32, dev);
      ring_attention::backward_step(dq_acc, dk_acc, dv_acc, dout, ctx.q, kb, vb, ctx.out, ctx.lse, i, r, cp,
                                    options(ctx));
      wd.wait();
      if (i > 0) {  // the block's dk / dv from the ranks before
        ops::add_inplace(dk_acc, dk_in);
        ops::add_inplace(dv_acc, dv_in);
      }
      dk_in = Tensor::empty(dk_acc.shape(), DType::F32, dev);
      dv_in = Tensor::empty(dv_acc.shape(), DType::F32, dev);
      wd = exchange(dk_acc, dv_acc, dk_in, dv_in, kTagDk, kTagDv);
      dk_sent = dk_acc, dv_sent = dv_acc;
      w.wait();
      kb = kn, vb = vn;
    }
    wd.wait();
    CoreAttentionGrads g{Tensor::empty(ctx.q.shape(), dout.dtype(), dev),
                         Tensor::empty(ctx.k.shape(), dout.dtype(), dev),
                         Tensor::empty(ctx.v.shape(), dout.dtype(), dev)};
    ops::cast(g.dq, dq_acc);
    ops::cast(g.dk, dk_in);
    ops::cast(g.dv, dv_in);
    return g;
  }

 private:
  int next() const { return (cp_->rank() + 1) % cp_->size(); }
  int prev() const { return (cp_->rank() + cp_->size() - 1) % cp_->size(); }
  // Send (a, b) to the next rank and receive their successors (an, bn) from the previous one.
  comm::Work exchange(const Tensor& a, const Tensor& b, Tensor& an, Tensor& bn, int tag_a, int tag_b) const {
    using K = comm::P2POp::Kind;
    return cp_->batch_p2p({{K::Send, a, next(), tag_a}, {K::Send, b, next(), tag_b}, {K::Recv, an, prev(), tag_a},
                           {K::Recv, bn, prev(), tag_b}});
  }
  ops::AttentionOptions options(const CoreAttentionCtx& ctx) const {
    return {.softmax_scale = opt_.softmax_scale,
            .causal = true,
            .deterministic = opt_.deterministic,
            .dropout_p = ctx.dropout ? opt_.attention_dropout : 0.0f,
            .dropout_key = ctx.dropout_key};
  }
  CoreAttentionOptions opt_;
  comm::CommPtr cp_;
};

}  // namespace

std::unique_ptr<CoreAttention> make_ring_attention(const CoreAttentionOptions& opt, comm::CommPtr cp) {
  return std::make_unique<RingAttention>(opt, std::move(cp));
}

}  // namespace mcpp
