// SelfAttention (Megatron-Core transformer/attention.py, local spec):
//   x [s, b, h] -> linear_qkv -> [s, b, ng, (np/ng + 2) * hn]   (fused QKV, rows grouped per query group:
//   for each group g: its np/ng query heads, then its key head, then its value head — Megatron's layout)
//   -> split q [s, b, np, hn], k/v [s, b, ng, hn] -> RoPE on q, k (rope configs) -> core attention
//   -> context [s, b, np*hn] -> linear_proj (output projection, init scaled by 1/sqrt(2L)) -> [s, b, h].
// Backward mirrors it; parameter grads accumulate into main_grad.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "mcpp/transformer/dot_product_attention.h"
#include "mcpp/transformer/linear.h"
#include "mcpp/transformer/rope.h"
#include "mcpp/transformer/spec.h"
#include "mcpp/transformer/transformer_config.h"

namespace mcpp {

struct SelfAttentionCtx {
  LinearCtx qkv;
  CoreAttentionCtx core;
  LinearCtx proj;
};

class SelfAttention {
 public:
  SelfAttention(ParamAndGradBuffer& params, const std::string& prefix, const TransformerConfig& config,
                const TransformerLayerSpec& spec);
  // rope: tables for the current sequence length (nullptr for learned/none positions).
  Tensor forward(SelfAttentionCtx& ctx, const Tensor& x, const RopeTables* rope, const ForwardOptions& opt) const;
  Tensor backward(SelfAttentionCtx& ctx, const Tensor& dy, const RopeTables* rope) const;

 private:
  int64_t np_, ng_, hn_, h_;
  Linear linear_qkv_;
  Linear linear_proj_;
  std::unique_ptr<CoreAttention> core_;
};

}  // namespace mcpp
