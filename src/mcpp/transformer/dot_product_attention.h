// Core attention: softmax(scale * Q K^T + causal mask) V, with GQA. Two implementations selected by the
// ModuleSpec (transformer/spec.h), equal in value (tests/transformer/spec_test.cpp):
//   "flash"   FlashAttention — blockwise online softmax (ops::flash_attention_*), never an [s, s] buffer.
//             Attention dropout is not supported in this form (config validation says so).
//   "unfused" DotProductAttention — Megatron's unfused path: scores [b*np, s, s] via GEMM,
//             fused_scale_mask_softmax, dropout on the probabilities, probs @ V.
// In: q [s, b, np, hn], k/v [s, b, ng, hn]. Out: context [s, b, np, hn]. Backward returns dq, dk, dv
// (overwritten). Saved state lives in CoreAttentionCtx.
#pragma once
#include <memory>
#include <string>

#include "mcpp/core/tensor.h"
#include "mcpp/transformer/module.h"

namespace mcpp {

struct CoreAttentionCtx {
  Tensor q, k, v;     // inputs as given (flash) or head-major copies [b, n, s, hn] (unfused)
  Tensor out, lse;    // flash: context [s, b, np, hn] and log-sum-exp [b, np, s]
  Tensor probs;       // unfused: softmax probabilities before dropout [b*np, s, s]
  PhiloxKey dropout_key;
  bool dropout = false;
};

struct CoreAttentionGrads {
  Tensor dq, dk, dv;  // [s, b, np|ng, hn]
};

class CoreAttention {
 public:
  virtual ~CoreAttention() = default;
  virtual Tensor forward(CoreAttentionCtx& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                         const ForwardOptions& opt) const = 0;
  virtual CoreAttentionGrads backward(CoreAttentionCtx& ctx, const Tensor& dout) const = 0;
};

struct CoreAttentionOptions {
  float softmax_scale = 1.0f;
  float attention_dropout = 0.0f;
  bool causal = true;
  bool deterministic = false;  // TransformerConfig::deterministic_mode (AttentionOptions::deterministic)
};

std::unique_ptr<CoreAttention> make_flash_attention(const CoreAttentionOptions& opt);
std::unique_ptr<CoreAttention> make_unfused_attention(const CoreAttentionOptions& opt);

}  // namespace mcpp
