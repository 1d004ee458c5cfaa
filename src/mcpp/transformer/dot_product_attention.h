// Core attention: softmax(scale * Q K^T + causal mask) V, with GQA. Two implementations selected by the
// ModuleSpec (transformer/spec.h), equal in value (tests/transformer/spec_test.cpp):
//   "flash"   FlashAttention — blockwise online softmax (ops::flash_attention_*), never an [s, s] buffer.
//             Attention dropout is drawn per tile from the key the unfused path would use (the same mask).
//   "unfused" DotProductAttention — Megatron's unfused path: scores [b*np, s, s] via GEMM,
//             fused_scale_mask_softmax, dropout on the probabilities, probs @ V.
// In: q [s, b, np, hn], k/v [s, b, ng, hn]. Out: context [s, b, np, hn]. Backward returns dq, dk, dv
// (overwritten). Saved state lives in CoreAttentionCtx.
// Packed sequences (ForwardOptions::packed_seq_params with doc_start): both mask keys before the query's document
// (flash: ops::AttentionOptions::doc_start; unfused: -inf scores before the softmax).
// Packed form (supports_packed_qkv(); flash only): forward_qkv takes linear_qkv's fused output
// qkv [s, b, ng * (np/ng + 2) * hn] (Megatron's layout, see attention.h) and backward_qkv returns dqkv of
// that shape — equal to qkv_split + forward and backward + qkv_merge (ops::flash_attention_{fwd,bwd}_qkv),
// without the split / merge copies on CUDA. The other implementations fail naming themselves.
#pragma once
#include <memory>
#include <string>

#include "mcpp/core/tensor.h"
#include "mcpp/transformer/module.h"

namespace mcpp {

struct CoreAttentionCtx {
  Tensor q, k, v;     // inputs as given (flash) or head-major copies [b, n, s, hn] (unfused)
  Tensor qkv;         // packed flash: the fused input [s, b, ng * (np/ng + 2) * hn] (q, k, v undefined)
  int64_t num_query_groups = 0;  // packed flash: ng
  Tensor out, lse;    // flash: context [s, b, np, hn] and log-sum-exp [b, np, s]
  Tensor probs;       // unfused: softmax probabilities before dropout [b*np, s, s]
  PhiloxKey dropout_key;  // both: the attention dropout mask's key (drawn once per forward)
  bool dropout = false;
  Tensor doc_start;       // both: packed sequences' document mask [b, s] (ForwardOptions::packed_seq_params)
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
  // Recompute of the core's inputs (Megatron's "mla_up_proj": MLA re-runs its up projections in backward):
  // release_inputs drops the q, k, v the forward kept (the unfused path: its head-major copies; its output, lse or
  // probabilities stay), restore_inputs sets them again from the same q, k, v [s, b, n, hn] before backward.
  // Implemented by the flash, the unfused and the ring attention; the default fails naming the implementation.
  virtual void release_inputs(CoreAttentionCtx& ctx) const;
  virtual void restore_inputs(CoreAttentionCtx& ctx, const Tensor& q, const Tensor& k, const Tensor& v) const;
  // Packed form (see the header); the defaults fail: only implementations that override them support it.
  virtual bool supports_packed_qkv() const { return false; }
  // qkv [s, b, ng * (np/ng + 2) * hn] -> context [s, b, np, hn]
  virtual Tensor forward_qkv(CoreAttentionCtx& ctx, const Tensor& qkv, int64_t np, int64_t ng,
                             const ForwardOptions& opt) const;
  // dout [s, b, np, hn] -> dqkv [s, b, ng * (np/ng + 2) * hn] (overwritten)
  virtual Tensor backward_qkv(CoreAttentionCtx& ctx, const Tensor& dout) const;
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
