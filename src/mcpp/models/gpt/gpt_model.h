// GPTModel (Megatron-Core models/gpt/gpt_model.py): embedding (pre_process) -> TransformerBlock ->
// output layer + loss (post_process).
//   tokens [s, b] int32 -> word (+ learned position) embeddings -> dropout -> [s, b, h]
//   -> decoder -> final norm -> logits [s*b, Vp] = x @ W_out^T  (W_out = word embeddings when tied)
//   -> cross entropy per token (fp32) -> loss = sum(loss * mask) / sum(mask).
// backward(ctx, grad_scale) back-propagates grad_scale * loss; every parameter gradient ACCUMULATES into
// the contiguous main-grad buffer (tied embedding: both uses add into the one parameter).
// Context per microbatch: GPTModelCtx (caller owns; a schedule may hold several).
#pragma once
#include <memory>

#include "mcpp/distributed/param_and_grad_buffer.h"
#include "mcpp/transformer/transformer_config.h"
#include "mcpp/transformer/transformer_layer.h"

namespace mcpp {

struct GPTModelCtx {
  Tensor tokens;          // [s, b] int32
  Tensor position_ids;    // [s*b] int32 (learned positions)
  PhiloxKey embedding_dropout_key;
  bool embedding_dropout = false;
  RopeTables rope;        // cos/sin rows for this sequence length (rope configs)
  TransformerBlockCtx decoder;
  Tensor final_hidden;    // [s*b, h] input of the output layer
  Tensor logits;          // [s*b, Vp]
  Tensor labels;          // [s*b] int32
  Tensor loss_mask;       // [s*b] float32
  Tensor lse;             // [s*b]
  double num_tokens = 0;  // sum(loss_mask)
};

struct LossResult {
  double loss = 0;        // sum(loss * mask) / sum(mask)
  double loss_sum = 0;    // sum(loss * mask)
  double num_tokens = 0;  // sum(mask)
};

class GPTModel {
 public:
  GPTModel(const TransformerConfig& config, uint64_t seed, Device device = Device::CPU);

  // Logits [s*b, Vp] (row = is*b + ib) for tokens [s, b].
  Tensor forward_logits(GPTModelCtx& ctx, const Tensor& tokens, const ForwardOptions& opt);
  // Forward + loss; labels int32 [s, b], loss_mask float32 [s, b].
  LossResult forward_loss(GPTModelCtx& ctx, const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask,
                          const ForwardOptions& opt);
  // d(grad_scale * loss)/d(params), accumulated into main grads. Needs a forward_loss ctx.
  void backward(GPTModelCtx& ctx, float grad_scale);

  ParamAndGradBuffer& params() { return params_; }
  const TransformerConfig& config() const { return config_; }

 private:
  RopeTables rope_for(int64_t s) const;
  Tensor embed(GPTModelCtx& ctx, const Tensor& tokens, const ForwardOptions& opt);
  void embed_backward(GPTModelCtx& ctx, const Tensor& dx);

  TransformerConfig config_;
  Device device_;
  ParamAndGradBuffer params_;
  Parameter* word_embeddings_ = nullptr;
  Parameter* position_embeddings_ = nullptr;
  Parameter* output_layer_ = nullptr;  // == word_embeddings_ when tied
  std::unique_ptr<TransformerBlock> decoder_;
  RopeTables rope_;
  bool has_rope_ = false;
};

}  // namespace mcpp
