// SelfAttention (Megatron-Core transformer/attention.py, local spec), tensor parallel over heads:
//   x [s(/tp with SP), b, h] -> linear_qkv (ColumnParallel) -> [s, b, ng/tp, (np/ng + 2) * hn]
//   (fused QKV, rows grouped per query group: for each group g its np/ng query heads, then its key head,
//   then its value head — Megatron's layout, so a TP rank's rows are whole groups)
//   -> split q [s, b, np/tp, hn], k/v [s, b, ng/tp, hn] -> with --qk-layernorm q_layernorm(q), k_layernorm(k)
//   (the model's norm over each head's hn channels; weights replicated over TP, their per-rank partial grads
//   all-reduced by finalize_model_grads with or without sequence parallelism: the TP ranks hold different heads)
//   -> RoPE on q, k (rope configs; without qk norms in the split's pass: ops::qkv_split_rope, backward
//   qkv_merge_rope) -> core attention
//   (dropout from the model-parallel RNG stream) -> context [s, b, np/tp*hn]
//   Without RoPE, without qk_layernorm and with a core attention that takes the fused rows (flash:
//   supports_packed_qkv()), the split and its backward merge are skipped: the core reads qkv and returns dqkv directly
//   (same values).
//   -> linear_proj (RowParallel, init scaled by 1/sqrt(2L); all-reduce or SP reduce-scatter) -> [s(/tp), b, h].
//   Generation with a KV cache (ForwardOptions::inference, inference_context.h): the split path (qk norms, RoPE at
//   the tokens' positions), then the cached core attention (prefill: the core's causal forward, keys / values stored;
//   decode: one query per sequence against the layer's memory) -> linear_proj. No backward.
//   Context parallelism (tp.cp, size cp > 1; Megatron's --cp-comm-type a2a): x holds this CP rank's s/cp rows;
//   the fused qkv rows go through all_to_all_cp2hp (whole sequence, ng/tp/cp query groups: RoPE tables for the
//   whole sequence), the core attention runs causally on the whole sequence, and the context comes back with
//   all_to_all_hp2cp before linear_proj; the backward runs the two all-to-alls the other way.
//   With tp.cp_p2p (--cp-comm-type p2p) the core attention is the ring form instead (ring_attention.h): no
//   all-to-all, every head of the TP rank over this CP rank's load-balanced rows (RoPE tables of those rows).
// Backward mirrors it; parameter grads accumulate into main_grad.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "mcpp/tensor_parallel/layers.h"
#include "mcpp/tensor_parallel/tp_context.h"
#include "mcpp/transformer/activation_dims.h"
#include "mcpp/transformer/dot_product_attention.h"
#include "mcpp/transformer/inference_context.h"
#include "mcpp/transformer/norms.h"
#include "mcpp/transformer/rope.h"
#include "mcpp/transformer/spec.h"
#include "mcpp/transformer/transformer_config.h"

namespace mcpp {

struct SelfAttentionCtx {
  tensor_parallel::ParallelLinearCtx qkv;
  CoreAttentionCtx core;
  tensor_parallel::ParallelLinearCtx proj;
  NormCtx q_norm, k_norm;  // --qk-layernorm
  // Selective recompute (recompute_granularity "selective"): the core attention's inputs — q, k, v
  // [s, b, np|ng, hn], or on the packed path fused_qkv [s, b, ng*(np/ng+2)*hn] — and the RNG streams
  // before it are kept; `core` is emptied after the forward and rebuilt (same dropout keys) at the start
  // of backward.
  Tensor q, k, v, fused_qkv;
  ForwardReplay core_replay;
};

// linear_proj's options (both attentions): RowParallel input_size -> hidden, Megatron's output-layer init (std scaled by
// 1 / sqrt(2 num_layers)), the linear bias per --disable-bias-linear, FP8 as the layer spec's linears (spec.h).
tensor_parallel::ParallelLinearOptions attention_output_options(const TransformerConfig& c,
                                                                const TransformerLayerSpec& spec,
                                                                const tensor_parallel::TPContext& tp,
                                                                int64_t input_size);

class SelfAttention {
 public:
  // Saved activations of one microbatch's forward (the memory planner; ActivationDims in activation_dims.h): the
  // fused linear_qkv output (flash without RoPE reads it packed) or the split q / k / v, n*(np+2ng)*hn*e; the core's
  // output = linear_proj's input n*np*hn*e; with qk_layernorm the split q, k and their norms' statistics; flash's
  // lse b*np*s*4 or the unfused fp32 probabilities b*np*s*s*cp*4; under all-to-all CP flash's own output besides
  // linear_proj's (hp2cp) input. Selective recompute "core_attn" keeps the core's inputs and linear_proj's input.
  // Context parallelism (all-to-all) holds the whole sequence for np / cp heads: the same element counts as s / cp
  // rows of all heads; the ring keeps s / cp rows of every head. Multi-latent attention: MLASelfAttention's.
  static int64_t saved_bytes(const TransformerConfig& config, const ActivationDims& d);
  SelfAttention(ParameterRegistry& params, const std::string& prefix, const TransformerConfig& config,
                const TransformerLayerSpec& spec, const tensor_parallel::TPContext& tp);
  // rope: tables for the current sequence length (nullptr for learned/none positions).
  Tensor forward(SelfAttentionCtx& ctx, const Tensor& x, const RopeTables* rope, const ForwardOptions& opt) const;
  // output_bias_grad_elsewhere: linear_proj's bias grad is taken from the residual stream (output_bias()).
  Tensor backward(SelfAttentionCtx& ctx, const Tensor& dy, const RopeTables* rope,
                  bool output_bias_grad_elsewhere = false) const;
  Parameter* output_bias() const { return linear_proj_.residual_bias(); }  // RowParallelLinear::residual_bias
  // Selective recompute "layernorm": drop the input linear_qkv keeps after the forward (under SP its all-gathered
  // copy) / set it again from the recomputed x before the backward.
  void release_input(SelfAttentionCtx& ctx) const { ctx.qkv.x = Tensor(); }
  void restore_input(SelfAttentionCtx& ctx, const Tensor& x) const { linear_qkv_.restore_input(ctx.qkv, x); }
  // ForwardOptions::input_norm in linear_qkv's FP8 input cast (ColumnParallelLinear::fp8_fuses_norm).
  bool fuses_input_norm() const { return linear_qkv_.fp8_fuses_norm(); }

 private:
  // The core attention reads the fused linear_qkv output (no split / merge): no RoPE, no qk norms and a packed
  // core.
  bool packed(const RopeTables* rope) const {
    return rope == nullptr && !q_layernorm_ && core_->supports_packed_qkv();
  }
  // qkv [s, b, ng/tp*(np/ng+2)*hn] -> q [s, b, np/tp(/cp), hn], k / v [s, b, ng/tp(/cp), hn] (allocated by the caller;
  // any leading dims of qkv's): the split with the qk norms and RoPE (rope tables of s rows).
  void split_heads(SelfAttentionCtx& ctx, const Tensor& qkv, const RopeTables* rope, Tensor& q, Tensor& k,
                   Tensor& v) const;
  // The forward with a KV cache (see the header).
  Tensor forward_cached(SelfAttentionCtx& ctx, const Tensor& x, const RopeTables* rope, InferenceContext& ic) const;

  std::string name_;          // the parameter prefix (the KV cache's key for this layer)
  int64_t np_, ng_, hn_, h_;  // np_ / ng_: heads and groups of this TP rank
  float softmax_scale_;
  int64_t core_np_ = 0, core_ng_ = 0;  // of the core attention: np_ / cp, ng_ / cp (the CP rank's head block)
  tensor_parallel::ColumnParallelLinear linear_qkv_;
  tensor_parallel::RowParallelLinear linear_proj_;
  std::optional<Norm> q_layernorm_, k_layernorm_;  // --qk-layernorm
  std::unique_ptr<CoreAttention> core_;
  bool recompute_core_ = false;  // selective recompute
  comm::CommPtr cp_;  // context-parallel group when cp > 1 in the all-to-all form (around the core), else null
};

}  // namespace mcpp
