// MoELayer (Megatron-Core transformer/moe/moe_layer.py): the MLP of a transformer layer as a mixture of experts.
//   x [s, b, h] -> n = s*b tokens -> TopKRouter (router.h): each token's k experts and weights probs [n, k]
//   -> ops::moe_permute into the expert-major buffer [m, h] (m = n*k dropless; with a capacity the kept routes,
//   or E * capacity rows padded with zeros) -> dispatcher to_experts (all-to-all over EP, all-gather over expert-TP)
//   -> SequentialMLP (this rank's experts; GroupedMLP with moe_grouped_gemm) -> dispatcher from_experts -> ops::moe_unpermute with the weights:
//   y[t] = sum_i probs[t, i] * expert_{topk[t, i]}(x[t])  -> [s, b, h]
//   (+ shared_experts(x)[t] with config.moe_shared_expert_intermediate_size > 0: a dense MLP of that width on
//   every token, tensor parallel like a dense layer's MLP; Megatron-Core's SharedExpertMLP — with
//   moe_shared_expert_gate its output scaled by sigmoid(x . gate_weight) per token: the sigmoid by
//   ops::moe_topk_softmax at E = k = 1, the scaling and its backward by moe_unpermute(_bwd) at k = 1).
// backward(dy, loss_grad_scale): ops::moe_unpermute_bwd gives the expert outputs' gradient and dprobs; the
// dispatcher carries the first to the experts and their input gradient back (the same collectives); the
// permute's backward sums each token's k rows (moe_unpermute, weights 1); the router adds its dx (from
// dprobs and the load-balancing losses, scaled by loss_grad_scale); the shared expert adds its dx. Parameter grads
// accumulate into main_grad.
// Parameters: the router's and the shared expert's in `params` ("<prefix>.router.weight",
// "<prefix>.shared_experts.linear_fc1/2..."), the routed experts' in `expert_params`
// ("<prefix>.experts.local_experts.<global index>..."; the model's expert buffer, GPTModel::expert_params()).
// moe_grouped_gemm (GroupedMLP, grouped_mlp.h): the experts' GEMMs grouped, sized by per-expert counts on the device;
// dropless at EP 1 and expert-TP 1 those are the router's (RouterCtx::counts, plan_local): no host read in the layer,
// so a CUDA graph can capture it; otherwise the plan's host counts, copied to the device once per new value.
// Under TP the layer needs sequence parallelism (each TP rank routes its own s/tp tokens; the router's
// load-balancing statistics are summed over TP and CP, router.h). EP from tp.ep, expert TP from tp.etp (null = 1):
// the experts' weights split over expert-TP, the dispatcher gathering their input rows and reducing their outputs.
#pragma once
#include <memory>
#include <string>

#include "mcpp/tensor_parallel/tp_context.h"
#include "mcpp/transformer/activation_dims.h"
#include "mcpp/transformer/moe/experts.h"
#include "mcpp/transformer/moe/grouped_mlp.h"
#include "mcpp/transformer/moe/router.h"
#include "mcpp/transformer/moe/token_dispatcher.h"

namespace mcpp::moe {

struct MoELayerCtx {
  RouterCtx router;
  DispatchPlan plan;
  ExpertsCtx experts;
  Tensor combined;  // [m, h] the experts' outputs back in this rank's expert-major order
  Tensor probs;     // [n, k] float32 on the tokens' device: the combine weights (TopKRouter's weights)
  MLPCtx shared;    // the shared expert's (empty between forward and backward under recompute "shared_experts")
  Tensor shared_input;  // recompute "shared_experts": the layer's input x (the router's too: no extra storage)
  tensor_parallel::Fp8ScaleStash shared_fp8;  // ... and the scales its FP8 linears cast with (fp8_recompute.h)
  // moe_shared_expert_gate: g = sigmoid(x w^T) per token (float32 [n, 1], with the sigmoid's scores / normalizer /
  // index from moe_topk_softmax at E = k = 1) and the shared expert's ungated output [n, h] (for dg = <dy, out>)
  Tensor gate, gate_scores, gate_lse, gate_top, shared_out;
};

class MoELayer {
 public:
  // Saved activations of one microbatch's forward (the memory planner; activation_dims.h; k = moe_router_topk,
  // fe = moe_ffn_hidden_size; each rank routes its n_l tokens): the router's input n_l*h*e (+ its jittered copy),
  // topk + idx + probs 3*n_l*k*4, scores + lse n_l*(E+1)*4 (+ the sigmoid z-loss's), the load-balancing counts,
  // the experts' rows in (gathered over expert-TP) and out (etp+1)*rows*h*e and their MLP contexts; rows = n_l*k
  // (dropless; exact at EP 1, assumed balanced under EP), E*capacity (padded), or min of the two (an upper bound
  // with drops). The experts' contexts are the same bytes for SequentialMLP and GroupedMLP (fc1's output and the
  // activation over every row); GroupedMLP's counts_on_device adds the router's int64 [E] counts. A shared expert
  // adds a dense MLP's context of width fs = shared size / tp (its input gathered under SP) unless recomputed
  // ("shared_experts"), and its gate's.
  static int64_t saved_bytes(const TransformerConfig& config, const ActivationDims& d, int64_t norm_out);
  // moe_grouped_gemm, dropless, at EP 1 and expert-TP 1: the grouped experts size their work from the router's
  // device counts (no host read in the layer; RouterCtx::counts kept until the backward).
  static bool counts_on_device(const TransformerConfig& config, int64_t ep, int64_t etp);
  // shared_expert_fp8: the shared expert's FP8 linears (the layer spec's linear_fp8, transformer/spec.h); the routed
  // experts stay in the model's dtype. Default: no FP8 (the layer built alone, in tests).
  MoELayer(ParameterRegistry& params, ParameterRegistry& expert_params, const std::string& prefix,
           const TransformerConfig& config, const tensor_parallel::TPContext& tp,
           const tensor_parallel::Fp8Options& shared_expert_fp8 = {});
  // [s, b, h] -> [s, b, h]; losses (non-null): this call's router losses are added to it; training: false in
  // evaluation; rng: the router's training noise (TopKRouter::forward).
  // fp8_recompute: the shared expert's FP8 linears under activation recompute (tensor_parallel/fp8_recompute.h).
  Tensor forward(MoELayerCtx& ctx, const Tensor& x, LossTracker* losses, bool training = true,
                 tensor_parallel::RngTracker* rng = nullptr,
                 const tensor_parallel::Fp8Recompute* fp8_recompute = nullptr) const;
  Tensor backward(MoELayerCtx& ctx, const Tensor& dy, float loss_grad_scale) const;
  const TopKRouter& router() const { return router_; }
  TopKRouter& router() { return router_; }
  const MoEAlltoAllTokenDispatcher& dispatcher() const { return dispatcher_; }
  // Selective recompute "layernorm" (after a training forward / before the backward): drop the references to the
  // layer's input x that the context keeps — the router's (the shared gate reads it too), the shared expert's fc1
  // input (under SP its all-gathered copy) or, under "shared_experts", its kept input — / set them again from the
  // recomputed x.
  void release_input(MoELayerCtx& ctx) const;
  void restore_input(MoELayerCtx& ctx, const Tensor& x) const;

 private:
  bool pad_;                             // experts' inputs padded to capacity (zero rows)
  bool recompute_shared_;                // selective recompute "shared_experts"
  TopKRouter router_;
  MoEAlltoAllTokenDispatcher dispatcher_;
  SequentialMLP experts_;
  std::unique_ptr<GroupedMLP> grouped_;  // moe_grouped_gemm: runs experts_' parameters
  bool device_counts_ = false;            // grouped, dropless, EP 1, expert-TP 1: the router's device counts
  // grouped with the plan's counts: them as an int64 host tensor (the ops then run cuBLASLt; kept while they repeat)
  const Tensor& expert_counts(const std::vector<int64_t>& counts) const;
  mutable Tensor counts_;
  std::unique_ptr<MLP> shared_experts_;  // moe_shared_expert_intermediate_size > 0
  Parameter* shared_gate_ = nullptr;     // [1, h] moe_shared_expert_gate
  const Tensor& rows(int64_t n, Device dev) const;  // int32 [n, 1] = 0..n-1 on dev (cached: none in a capture)
  mutable Tensor rows_;
};

}  // namespace mcpp::moe
