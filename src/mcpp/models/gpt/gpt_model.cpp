#include "mcpp/models/gpt/gpt_model.h"

#include <cmath>

#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/transformer/spec.h"

namespace mcpp {

GPTModel::GPTModel(const TransformerConfig& c, uint64_t seed, Device device) : config_(c), device_(device) {
  MCPP_CHECK(c.padded_vocab_size > 0, "GPTModel: padded_vocab_size is not set (tokenizer not applied to config)");
  const TransformerLayerSpec spec = get_gpt_layer_local_spec(c);
  word_embeddings_ = params_.add({.key = "embedding.word_embeddings.weight",
                                  .shape = {c.padded_vocab_size, c.hidden_size},
                                  .std = c.init_method_std});
  if (c.position_embedding_type == PositionEmbedding::LearnedAbsolute)
    position_embeddings_ = params_.add({.key = "embedding.position_embeddings.weight",
                                        .shape = {c.max_position_embeddings, c.hidden_size},
                                        .std = c.init_method_std});
  decoder_ = std::make_unique<TransformerBlock>(params_, c, spec, 0, c.num_layers, /*post_process=*/true);
  output_layer_ = c.untie_embeddings_and_output_weights
                      ? params_.add({.key = "output_layer.weight",
                                     .shape = {c.padded_vocab_size, c.hidden_size},
                                     .std = c.init_method_std})
                      : word_embeddings_;
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
  ops::embedding_fwd(x, ids, word_embeddings_->data, 0);
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
  ctx.embedding_dropout = dropout_active(opt, config_.hidden_dropout);
  if (ctx.embedding_dropout) {
    MCPP_CHECK(opt.rng, "embedding dropout needs an RNG stream");
    ctx.embedding_dropout_key = opt.rng->draw(static_cast<uint64_t>(x.numel()));
    ops::dropout_fwd(x, x, config_.hidden_dropout, ctx.embedding_dropout_key);
  }
  return x.view({s, b, h});
}

void GPTModel::embed_backward(GPTModelCtx& ctx, const Tensor& dx_in) {
  const int64_t n = ctx.tokens.numel();
  Tensor dx = dx_in.view({n, config_.hidden_size});
  if (ctx.embedding_dropout) ops::dropout_bwd(dx, dx, config_.hidden_dropout, ctx.embedding_dropout_key);
  ops::embedding_bwd(word_embeddings_->main_grad, ctx.tokens.view({n}), dx, 0);
  if (position_embeddings_) ops::embedding_bwd(position_embeddings_->main_grad, ctx.position_ids, dx, 0);
}

Tensor GPTModel::forward_logits(GPTModelCtx& ctx, const Tensor& tokens, const ForwardOptions& opt) {
  MCPP_CHECK(tokens.ndim() == 2 && tokens.dtype() == DType::I32, "tokens must be int32 [s, b], got {}", tokens.str());
  const int64_t s = tokens.size(0), b = tokens.size(1);
  Tensor x = embed(ctx, tokens, opt);
  ctx.rope = rope_for(s);
  Tensor h = decoder_->forward(ctx.decoder, x, has_rope_ ? &ctx.rope : nullptr, opt);  // [s, b, h]
  ctx.final_hidden = h.view({s * b, config_.hidden_size});
  ctx.logits = Tensor::empty({s * b, config_.padded_vocab_size}, DType::F32, device_);
  ops::linear_fwd(ctx.logits, ctx.final_hidden, output_layer_->data, nullptr);
  return ctx.logits;
}

LossResult GPTModel::forward_loss(GPTModelCtx& ctx, const Tensor& tokens, const Tensor& labels,
                                  const Tensor& loss_mask, const ForwardOptions& opt) {
  forward_logits(ctx, tokens, opt);
  const int64_t n = tokens.numel();
  ctx.labels = labels.view({n});
  ctx.loss_mask = loss_mask.view({n});
  Tensor loss = Tensor::empty({n}, DType::F32, device_);
  ctx.lse = Tensor::empty({n}, DType::F32, device_);
  ops::cross_entropy_fwd(loss, ctx.lse, ctx.logits, ctx.labels);
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
  ops::cross_entropy_bwd(dlogits, dloss, ctx.logits, ctx.labels, ctx.lse);
  Tensor dh = Tensor::empty({n, config_.hidden_size}, DType::F32, device_);
  ops::linear_bwd(&dh, output_layer_->main_grad, nullptr, dlogits, ctx.final_hidden, output_layer_->data);
  Tensor dx = decoder_->backward(ctx.decoder, dh.view({s, b, config_.hidden_size}),
                                 has_rope_ ? &ctx.rope : nullptr);
  embed_backward(ctx, dx);
  ctx.logits = Tensor();  // consumed
}

}  // namespace mcpp
