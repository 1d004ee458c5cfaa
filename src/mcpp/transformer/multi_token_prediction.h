// Multi-token prediction (Megatron-Core transformer/multi_token_prediction.py; DeepSeek-V3's MTP), one depth:
//   MultiTokenPredictionLayer k (k = 1..D, keys "mtp.layers.<k-1>.*"):
//     e = the embedding of the tokens rolled k positions left (the model's shared word embeddings, with the
//         embedding dropout, scattered to [s/tp] under SP: GPTModel computes it)
//     x = eh_proj(concat(enorm(e), hnorm(h_{k-1})))   eh_proj: ColumnParallelLinear 2h -> h, no bias; its output
//         [s, b, h/tp] all-gathered over the last dim (gather_from_tp), then scattered to [s/tp] under SP
//     h_k = final_layernorm(transformer_layer(x))     one TransformerLayer ("<prefix>.transformer_layer.*") of the
//         decoder's last layer's kind (dense or MoE), its own norms, the same RoPE tables
//   h_0 is the decoder's output after its final norm; h_k feeds the shared output layer (GPTModel: logits and the
//   cross entropy against the labels rolled k positions) and depth k + 1.
// Full recompute (recompute_granularity full, method uniform; Megatron's _checkpointed_forward of the depth): a
// training forward keeps only the depth's two inputs (h_{k-1}, kept anyway as the previous output layer's input,
// and e) and the RNG streams it found; backward re-runs the depth from them (bitwise the same activations) right
// before its backward. With method block the depth is not recomputed (Megatron warns and runs it plainly too).
// Selective recompute applies inside the transformer layer as in the decoder's.
#pragma once
#include <memory>
#include <string>
#include <utility>

#include "mcpp/tensor_parallel/layers.h"
#include "mcpp/transformer/activation_dims.h"
#include "mcpp/transformer/transformer_layer.h"

namespace mcpp {

// Megatron's MultiTokenPredictionLayerSubmodules: what one depth is built from. The norms' factories (the decoder's
// norm by default) and the transformer layer's spec (the decoder's last layer spec, so a MoE layer when that one is,
// and its linears "local" when that one keeps them in bf16); the eh_proj linear stays in the model's dtype;
// models/gpt/gpt_layer_specs.h's get_gpt_mtp_layer_spec chooses them.
struct MtpLayerSpec {
  NormFactory make_enorm, make_hnorm, make_final_layernorm;
  TransformerLayerSpec transformer_layer;
};

struct MultiTokenPredictionLayerCtx {
  NormCtx enorm, hnorm;
  tensor_parallel::ParallelLinearCtx eh_proj;
  TransformerLayerCtx layer;
  NormCtx final_layernorm;
  bool recomputed = false;  // full recompute: only the inputs below are kept between forward and backward
  Tensor hidden_in, embedding_in;
  ForwardReplay replay;
  tensor_parallel::Fp8ScaleStash fp8;  // the scales the depth's FP8 linears cast with (fp8_recompute.h)
};

class MultiTokenPredictionLayer {
 public:
  // Saved activations of one depth's forward with labels (the memory planner; activation_dims.h): its rolled
  // tokens, labels, mask and lse 4*n*4, the loss statistics 8 (+ 8 per-token), logits n*Vp/tp*e, the output layer's
  // input n*h*e; then the embedding n_l*h*e and h_{k-1} (its own [s/tp] tensor under SP, else the previous head's
  // output-layer input) with the two norms' statistics, eh_proj's input n*2h*e, the transformer layer's input and
  // context (the decoder's last layer's kind), the final norm's input and statistics. Under full uniform recompute
  // only the depth's two inputs besides the loss part.
  static int64_t saved_bytes(const TransformerConfig& config, const ActivationDims& d);
  // depth: 0-based (keys "mtp.layers.<depth>"); spec: the depth's norms and transformer layer.
  MultiTokenPredictionLayer(ParameterRegistry& params, ParameterRegistry& expert_params, int64_t depth,
                            const TransformerConfig& config, const MtpLayerSpec& spec,
                            const tensor_parallel::TPContext& tp);
  // hidden = h_{k-1}, embedding = e: both [s(/tp), b, h]. Returns h_k [s(/tp), b, h].
  Tensor forward(MultiTokenPredictionLayerCtx& ctx, const Tensor& hidden, const Tensor& embedding,
                 const RopeTables* rope, const ForwardOptions& opt) const;
  // dy = d h_k. Returns {d hidden, d embedding}; parameter grads accumulate. loss_grad_scale: the MoE router
  // losses' coefficient (as TransformerLayer::backward).
  std::pair<Tensor, Tensor> backward(MultiTokenPredictionLayerCtx& ctx, const Tensor& dy, const RopeTables* rope,
                                     float loss_grad_scale) const;
  moe::MoELayer* moe_layer() const { return layer_.moe_layer(); }

 private:
  Tensor run(MultiTokenPredictionLayerCtx& ctx, const Tensor& hidden, const Tensor& embedding, const RopeTables* rope,
             const ForwardOptions& opt) const;

  tensor_parallel::TPContext tp_;
  int64_t hidden_size_;
  bool recompute_;  // full recompute, uniform
  Norm enorm_, hnorm_;
  tensor_parallel::ColumnParallelLinear eh_proj_;
  TransformerLayer layer_;
  Norm final_layernorm_;
};

// The MTP losses of the training forwards since the last log line, per depth: float32 [D, 2] on the device of
// {sum of the microbatches' mean losses, number of microbatches} (Megatron's MTPLossLoggingHelper tracker; a CUDA
// graph's replays add into the same tensor).
class MtpLossTracker {
 public:
  explicit MtpLossTracker(int64_t depths = 0) : depths_(depths) {}
  // v: float32 [2] {mean loss, 1} of one microbatch at `depth`, on the model's device.
  void add(const Tensor& v, int64_t depth);
  // {sum of means, count} per depth (a host read), then zeroed in place.
  std::vector<std::pair<double, double>> take();
  int64_t depths() const { return depths_; }

 private:
  int64_t depths_;
  Tensor sums_;
};

}  // namespace mcpp
