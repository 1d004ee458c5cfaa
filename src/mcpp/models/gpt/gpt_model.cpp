#include "mcpp/models/gpt/gpt_model.h"

#include <cmath>

#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/tensor_parallel/mappings.h"
#include "mcpp/tensor_parallel/vocab_parallel.h"
#include "mcpp/transformer/spec.h"

namespace mcpp {

namespace tp = tensor_parallel;

GPTModel::GPTModel(const TransformerConfig& c, uint64_t seed, const tp::TPContext& tpc, Device device)
    : config_(c), tp_(tpc), device_(device) {
  MCPP_CHECK(c.padded_vocab_size > 0, "GPTModel: padded_vocab_size is not set (tokenizer not applied to config)");
  const TransformerLayerSpec spec = get_gpt_layer_local_spec(c);
  tp::VocabParallelEmbedding word(params_, "embedding.word_embeddings.weight", c.padded_vocab_size, c.hidden_size,
                                  c.init_method_std, tp_.group);
  word_embeddings_ = word.weight();
  vocab_local_ = word_embeddings_->spec.shape[0];
  vocab_start_ = word.vocab_start();
  if (c.position_embedding_type == PositionEmbedding::LearnedAbsolute)
    position_embeddings_ = params_.add({.key = "embedding.position_embeddings.weight",
                                        .shape = {c.max_position_embeddings, c.hidden_size},
                                        .std = c.init_method_std});
  decoder_ = std::make_unique<TransformerBlock>(params_, c, spec, tp_, 0, c.num_layers, /*post_process=*/true);
  const tp::ParallelLinearOptions out_opt{.input_size = c.hidden_size,
                                          .output_size = c.padded_vocab_size,
                                          .bias = false,
                                          .init_std = c.init_method_std,
                                          .sequence_parallel = tp_.sequence_parallel};
  output_layer_ = c.untie_embeddings_and_output_weights
                      ? std::make_unique<tp::ColumnParallelLinear>(params_, "output_layer", out_opt, tp_.group)
                      : std::make_unique<tp::ColumnParallelLinear>(word_embeddings_, out_opt, tp_.group);
  params_.finalize(seed, device);
  if (c.position_embedding_type == PositionEmbedding::Rope) {
    const auto rot = static_cast<int64_t>(std::lround(static_cast<double>(c.kv_channels) * c.rotary_percent));
    rope_ = make_rope_tables(std::max(c.seq_length, c.max_position_embeddings), rot, c.rotary_base, device);
    has_rope_ = true;
  }
}

RopeTables GPTModel::rope_for(int64_t s) const {
  if (!has_rope_) return {};
  MCPP_CHECK(s <= rope_.cos.size(0), "sequence length {} exceeds the rotary table ({})", s, rope_.cos.size(0));
  return {rope_.cos.narrow0(0, s), rope_.sin.narrow0(0, s)};  // rows 0..s-1 (views)
}

Tensor GPTModel::embed(GPTModelCtx& ctx, const Tensor& tokens, const ForwardOptions& opt) {
  const int64_t s = tokens.size(0), b = tokens.size(1), h = config_.hidden_size;
  ctx.tokens = tokens;
  Tensor ids = tokens.view({s * b});
  Tensor x = Tensor::empty({s * b, h}, DType::F32, device_);  // [s*b, h]
  ops::embedding_fwd(x, ids, word_embeddings_->data, vocab_start_);
  tp::all_reduce_tp(*tp_.group, x);  // VocabParallelEmbedding: reduce_from_tp
  if (position_embeddings_) {
    MCPP_CHECK(s <= config_.max_position_embeddings, "sequence length {} exceeds max_position_embeddings {}", s,
               config_.max_position_embeddings);
    Tensor pos = Tensor::empty({s * b}, DType::I32);
    for (int64_t i = 0; i < s * b; ++i) pos.data<int32_t>()[i] = static_cast<int32_t>(i / b);
    ctx.position_ids = pos.to(device_);
    Tensor pe = Tensor::empty({s * b, h}, DType::F32, device_);
    ops::embedding_fwd(pe, ctx.position_ids, position_embeddings_->data, 0);
    ops::add_inplace(x, pe);
  }
  Tensor out = x.view({s, b, h});
  if (tp_.sequence_parallel) out = tp::split_sp(*tp_.group, out).clone();  // scatter_to_sp: [s/tp, b, h]
  ctx.embedding_dropout = dropout_active(opt, config_.hidden_dropout);
  if (ctx.embedding_dropout) {
    MCPP_CHECK(opt.rng, "embedding dropout needs an RNG stream");
    ctx.embedding_dropout_key = opt.rng->draw(static_cast<uint64_t>(out.numel()), tp_.sequence_parallel);
    ops::dropout_fwd(out, out, config_.hidden_dropout, ctx.embedding_dropout_key);
  }
  return out;
}

void GPTModel::embed_backward(GPTModelCtx& ctx, const Tensor& dx_in) {
  Tensor dx = dx_in;
  if (ctx.embedding_dropout) {
    dx = dx_in.clone();
    ops::dropout_bwd(dx, dx, config_.hidden_dropout, ctx.embedding_dropout_key);
  }
  if (tp_.sequence_parallel) dx = tp::all_gather_sp(*tp_.group, dx);  // scatter_to_sp backward: [s, b, h]
  const int64_t n = ctx.tokens.numel();
  Tensor d2 = dx.view({n, config_.hidden_size});
  // reduce_from_tp backward is the identity: every TP rank holds the full gradient.
  ops::embedding_bwd(word_embeddings_->main_grad, ctx.tokens.view({n}), d2, vocab_start_);
  word_embeddings_->grad_ready();  // its last use (the tied output layer's backward ran first)
  if (position_embeddings_) {
    ops::embedding_bwd(position_embeddings_->main_grad, ctx.position_ids, d2, 0);
    position_embeddings_->grad_ready();
  }
}

Tensor GPTModel::forward_logits(GPTModelCtx& ctx, const Tensor& tokens, const ForwardOptions& opt) {
  MCPP_CHECK(tokens.ndim() == 2 && tokens.dtype() == DType::I32, "tokens must be int32 [s, b], got {}", tokens.str());
  const int64_t s = tokens.size(0);
  Tensor x = embed(ctx, tokens, opt);
  ctx.rope = rope_for(s);
  Tensor h = decoder_->forward(ctx.decoder, x, has_rope_ ? &ctx.rope : nullptr, opt);  // [s(/tp), b, h]
  Tensor logits = output_layer_->forward(ctx.output, h);                              // [s, b, Vp/tp]
  ctx.logits = logits.view({-1, vocab_local_});                                       // [s*b, Vp/tp]
  return ctx.logits;
}

Tensor GPTModel::gather_logits(const Tensor& local) const {
  if (tp_.size() == 1) return local;
  // all-gather gives [tp, n, Vp/tp]; interleave into [n, Vp].
  const int64_t n = local.size(0), t = tp_.size();
  Tensor all = Tensor::empty({t * n, vocab_local_}, DType::F32, local.device());
  tp_.group->all_gather(all, local).wait();
  Tensor host = all.to(Device::CPU), out = Tensor::empty({n, t * vocab_local_});
  for (int64_t r = 0; r < t; ++r)
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(host.data<float>() + (r * n + i) * vocab_local_, vocab_local_,
                  out.data<float>() + i * t * vocab_local_ + r * vocab_local_);
  return out.to(local.device());
}

LossResult GPTModel::forward_loss(GPTModelCtx& ctx, const Tensor& tokens, const Tensor& labels,
                                  const Tensor& loss_mask, const ForwardOptions& opt) {
  forward_logits(ctx, tokens, opt);
  const int64_t n = tokens.numel();
  ctx.labels = labels.view({n});
  ctx.loss_mask = loss_mask.view({n});
  Tensor loss = Tensor::empty({n}, DType::F32, device_);
  ctx.lse = Tensor::empty({n}, DType::F32, device_);
  tp::vocab_parallel_cross_entropy_fwd(loss, ctx.lse, ctx.logits, ctx.labels, vocab_start_, *tp_.group);
  Tensor loss_h = loss.to(Device::CPU), mask_h = ctx.loss_mask.to(Device::CPU);
  LossResult r;
  for (int64_t i = 0; i < n; ++i) {
    r.loss_sum += static_cast<double>(loss_h.data<float>()[i]) * mask_h.data<float>()[i];
    r.num_tokens += mask_h.data<float>()[i];
  }
  r.loss = r.num_tokens > 0 ? r.loss_sum / r.num_tokens : 0.0;
  ctx.num_tokens = r.num_tokens;
  return r;
}

void GPTModel::backward(GPTModelCtx& ctx, float grad_scale) {
  MCPP_CHECK(ctx.lse.defined(), "GPTModel::backward needs the context of a forward_loss");
  const int64_t n = ctx.labels.numel(), s = ctx.tokens.size(0), b = ctx.tokens.size(1);
  // d(grad_scale * sum(loss*mask)/sum(mask)) / d loss_i
  Tensor dloss = ctx.loss_mask.to(Device::CPU).clone();
  const float coef = ctx.num_tokens > 0 ? static_cast<float>(grad_scale / ctx.num_tokens) : 0.0f;
  for (int64_t i = 0; i < n; ++i) dloss.data<float>()[i] *= coef;
  dloss = dloss.to(device_);
  Tensor dlogits = ctx.logits;  // in place: the logits are not needed afterwards
  tp::vocab_parallel_cross_entropy_bwd(dlogits, dloss, ctx.logits, ctx.labels, ctx.lse, vocab_start_, *tp_.group);
  Tensor dh = output_layer_->backward(ctx.output, dlogits.view({s, b, vocab_local_}));  // [s(/tp), b, h]
  Tensor dx = decoder_->backward(ctx.decoder, dh, has_rope_ ? &ctx.rope : nullptr);
  embed_backward(ctx, dx);
  ctx.logits = Tensor();  // consumed
}

}  // namespace mcpp
