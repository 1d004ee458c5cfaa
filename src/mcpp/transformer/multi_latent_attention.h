// MLASelfAttention (Megatron-Core transformer/multi_latent_attention.py with the local spec; DeepSeek-V2/V3's
// multi-latent attention), tensor parallel over heads. n heads (n/tp per rank), dn = qk_head_dim, dr =
// qk_pos_emb_head_dim, dv = v_head_dim, rq = q_lora_rank, rkv = kv_lora_rank; x [s(/tp with SP), b, h]:
//   queries:  rq > 0: linear_q_down_proj (ColumnParallel h -> rq, no bias) -> gather_from_tp (all_gather_last_dim)
//             -> [SP: scatter_to_sp] -> q_layernorm (--qk-layernorm) -> linear_q_up_proj (ColumnParallel rq ->
//             n (dn + dr)); rq == 0: linear_q_proj (ColumnParallel h -> n (dn + dr)).  q [s, b, n/tp, dn + dr]
//   keys / values: linear_kv_down_proj (ColumnParallel h -> rkv + dr) -> gather_from_tp -> kv_latent [s, b, rkv + dr]:
//             its first rkv channels -> [SP: scatter_to_sp] -> kv_layernorm (--qk-layernorm) -> linear_kv_up_proj
//             (ColumnParallel rkv -> n (dn + dv)) = kv [s, b, n/tp, dn + dv]; its last dr channels are the key's
//             rotary part, one for all heads.
//   ops::mla_qkv_fwd: query = [q_nope, rope(q_pe)], key = [k_nope, rope(k_pe)], value = v, each head zero-padded to
//             dc = max(dn + dr, dv) (Megatron's MLA channel order; the RoPE tables are the model's — rope or YaRN,
//             gpt_model.h — over dr channels, YaRN's mscale in them)
//   -> core attention (softmax scale mscale(rotary_scaling_factor, mscale_all_dim)^2 / sqrt(dn + dr), causal,
//   attention dropout) -> context [s, b, n/tp, dc], its first dv channels -> linear_proj (RowParallel n dv -> h,
//   init scaled by 1/sqrt(2L); all-reduce or SP reduce-scatter) -> [s(/tp), b, h].
// Selective recompute "mla_up_proj" (Megatron's): the core's query / key / value are dropped after its forward and
// rebuilt before its backward (linear_q(_up)_proj / linear_kv_up_proj's GEMMs from their kept inputs, mla_qkv_fwd from
// the kept k_pe): bitwise the forward's; with "core_attn" too the core's forward then re-runs on them.
// Backward mirrors it. The key's rotary gradient (ops::mla_qkv_bwd's dk_pe, summed over this rank's heads) is
// all-reduced over TP before it joins the latent's gradient — every rank's heads read the one shared k_pe (Megatron
// omits this reduction when linear_kv_down_proj is column parallel, NVIDIA/Megatron-LM#1699; here the gradient is
// the single-rank model's, tested against it). The latent norms' weights are replicated; under SP their partial
// grads are all-reduced by finalize_model_grads (sequence_parallel params), without SP every rank's are whole.
// Generation with a KV cache (ForwardOptions::inference, inference_context.h): query / key / value as above (a decode
// step's RoPE at each sequence's position), then the cached core attention over the full per-head keys / values
// after the up-projections, zero-padded to dc (not the absorbed / latent form), -> linear_proj. No backward.
// Context parallelism: the RoPE and mla_qkv_fwd run on this CP rank's rows (the model hands MLA their rows of the
// tables in either form). --cp-comm-type a2a: query / key / value go through all_to_all_cp2hp (the whole sequence,
// n/tp/cp heads), the core attends causally over it and the context comes back with all_to_all_hp2cp; p2p: the ring
// attention on the rank's load-balanced rows, every head of the TP rank. Parameter grads accumulate into main_grad.
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

struct MLASelfAttentionCtx {
  tensor_parallel::ParallelLinearCtx q_down, q_up, kv_down, kv_up, proj;  // q_down / q_up: q_proj in q_up when rq == 0
  NormCtx q_norm, kv_norm;
  CoreAttentionCtx core;
  // Selective recompute "core_attn": the core attention's inputs and the RNG streams before it are kept; `core` is
  // emptied after the forward and rebuilt at the start of backward. "mla_up_proj": query / key / value are not kept
  // (neither here nor in `core`) but rebuilt in backward from the up projections' kept inputs and k_pe, the latent's
  // rotary channels [s, b, dr].
  Tensor query, key, value, k_pe;
  ForwardReplay core_replay;
};

class MLASelfAttention {
 public:
  // Saved activations of one microbatch's forward (the memory planner; activation_dims.h), beyond the
  // input_layernorm output the layer counts once: under SP the second down projection's own gathered copy of it
  // (norm_out: 0 when selective "layernorm" drops the norms' outputs); each latent's norm input + statistics and
  // its up projection's input; the core's query / key / value [n, np, dc] (dc = max(dn + dr, dv);
  // "mla_up_proj": only the latent's rotary channels [n, dr]); the core's output when it is not linear_proj's input
  // (padded heads, or the all-to-all CP copy); its lse or probabilities; linear_proj's input [n, np*dv].
  static int64_t saved_bytes(const TransformerConfig& config, const ActivationDims& d, int64_t norm_out);
  MLASelfAttention(ParameterRegistry& params, const std::string& prefix, const TransformerConfig& config,
                   const TransformerLayerSpec& spec, const tensor_parallel::TPContext& tp);
  // rope: the model's MLA tables (dr / 2 columns) for the current sequence length.
  Tensor forward(MLASelfAttentionCtx& ctx, const Tensor& x, const RopeTables* rope, const ForwardOptions& opt) const;
  Tensor backward(MLASelfAttentionCtx& ctx, const Tensor& dy, const RopeTables* rope,
                  bool output_bias_grad_elsewhere = false) const;
  Parameter* output_bias() const { return linear_proj_.residual_bias(); }
  // Selective recompute "layernorm": the down projections' (or linear_q_proj's) kept input released / set again.
  void release_input(MLASelfAttentionCtx& ctx) const;
  void restore_input(MLASelfAttentionCtx& ctx, const Tensor& x) const;

 private:
  // The core attention's inputs from this rank's rows [s, b, n, dc] (a2a: cp2hp, [S, b, n/cp, dc]) and its
  // output's way back (a2a: hp2cp); identities without the all-to-all form.
  Tensor to_core(const Tensor& x) const;
  Tensor from_core(const Tensor& x) const;
  // context [s, b, n/tp, dc]: its first dv channels of each head -> linear_proj -> [s(/tp), b, h]
  Tensor project_context(MLASelfAttentionCtx& ctx, Tensor context) const;

  std::string name_;                          // the parameter prefix (the KV cache's key for this layer)
  int64_t n_, dn_, dr_, dv_, dc_, rq_, rkv_;  // n_: this TP rank's heads
  float softmax_scale_;
  int64_t core_n_ = 0;                        // the core attention's heads: n_ / cp (a2a), else n_
  tensor_parallel::TPContext tp_;
  std::optional<tensor_parallel::ColumnParallelLinear> linear_q_proj_, linear_q_down_proj_, linear_q_up_proj_;
  tensor_parallel::ColumnParallelLinear linear_kv_down_proj_, linear_kv_up_proj_;
  std::optional<Norm> q_layernorm_, kv_layernorm_;  // --qk-layernorm
  tensor_parallel::RowParallelLinear linear_proj_;
  std::unique_ptr<CoreAttention> core_;
  bool recompute_core_ = false;
  bool recompute_up_ = false;  // "mla_up_proj"
  comm::CommPtr cp_;           // the context-parallel group in the all-to-all form (cp > 1), else null
};

// Megatron's MLA softmax scale: mscale(rotary_scaling_factor, mscale_all_dim)^2 / sqrt(qk_head_dim +
// qk_pos_emb_head_dim) (whatever the rope type).
float mla_softmax_scale(const TransformerConfig& c);

}  // namespace mcpp
