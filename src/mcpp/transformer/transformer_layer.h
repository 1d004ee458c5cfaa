// TransformerLayer (pre-norm, Megatron-Core transformer_layer.py):
//   x1 = x  + dropout(self_attention(input_layernorm(x)))      (bias-dropout-add, hidden_dropout)
//   y  = x1 + dropout(mlp(pre_mlp_layernorm(x1)))
// In/out [s, b, h], or [s/tp, b, h] shards with sequence parallelism (norms, dropout and residuals run on
// the shard; hidden dropout then draws from the model-parallel RNG stream, else from the default one).
// Both residual adds run fused with the norm that reads their sum (Norm::forward_add): x1 = x + attn with
// pre_mlp_layernorm, and y = x1 + mlp is returned unsummed (Residual) so that the next layer's
// input_layernorm — or the block's final_layernorm — adds it in its kernel (the block materializes the
// sum only where a plain tensor leaves it: its output without a final norm, a recomputed group's kept
// input). The sums are bitwise those of a separate add. In backward both residual gradient adds run
// inside the norms' backward (Norm::backward with dres), as Apex's fused add + norm. Without hidden
// dropout, pre_mlp_layernorm's backward also sums the bias grads of linear_fc2 (over dres = dy) and
// linear_proj (over its dx = dx1), the column sums linear_bwd would otherwise take in a separate pass
// (not with sequence parallelism: RowParallelLinear::residual_bias).
// Hidden dropout is Megatron's bias-dropout-add inside the same norms: the attention branch's dropout runs
// in pre_mlp_layernorm's forward and backward (which writes dattn beside dx1 and sums linear_proj's bias
// grad over it); the mlp branch's rides in the Residual to the norm that adds it — the next layer's
// input_layernorm, whose backward returns dmlp beside dx (ResidualGrad::branch). Where the sum is
// materialized instead (Residual::sum: the final norm's input, a pipeline stage's output, a recomputed
// group's input) the dropout is a separate pass and the layer's backward applies its own dropout_bwd. Both
// give the same bits (same masks from the same keys, same roundings, same reduction partitions), so
// recompute and pipeline layouts stay bitwise equal to the plain run; for that linear_fc2's bias grad under
// dropout stays in its wgrad (cuBLASLt's BGRADB epilogue: free at 1.3B) rather than in whichever norm.
// The parts come from a TransformerLayerSpec (spec.h; chosen in models/gpt/gpt_layer_specs.cpp): the layer holds one
// AttentionModule (SelfAttention or MLASelfAttention, with its core attention) and one MlpModule (a dense MLP or,
// in the layers config.moe_layer_pattern() selects, a MoELayer: router, token dispatch, experts) and builds its
// two norms with the spec's factories; it never names an implementation. Its modules' linears run FP8 or not as the
// spec's linear / linear_fp8 say (per layer: Megatron's --first-last-layers-bf16). A MoE layer's output has no bias of its own
// (MlpModule::output_bias() null), so no bias grad rides in pre_mlp_layernorm's backward for it; its backward takes
// the microbatch's loss_grad_scale (the router's load-balancing losses).
// Selective recompute of the MLP (recompute_modules "mlp" in a dense layer, "moe" in a MoE layer; Megatron's
// checkpointed mlp / moe_layer_recompute): a training forward keeps only the MLP's input and drops its context;
// backward re-runs the MLP's forward from it (the MoE router without recording losses or expert-bias counts, as
// Megatron's checkpoint re-run, drawing its jitter / random logits from a copy of the RNG streams it found) right
// before its backward — bitwise the same activations.
// Selective recompute "layernorm" (Megatron's recompute of input_layernorm / pre_mlp_layernorm): a training forward
// releases each norm's output where its branch keeps it (linear_qkv's saved input; the MLP's fc1 input, or the MoE
// router's and shared expert's; under SP the all-gathered copies; with "mlp" / "moe" the kept MLP input); when the
// backward reaches the branch (as Megatron's hook on the branch's output) the norm re-runs from its kept input and
// statistics (Norm::recompute: the same bits) and the branch gets its input back (re-gathered under SP).
// Backward returns dx (and b's gradient, above); parameter grads accumulate into main_grad.
// FP8 delayed scaling without SP (Transformer Engine's LayerNormLinear): a norm whose output only the next linear
// reads — input_layernorm's into linear_qkv, pre_mlp_layernorm's into a dense MLP's fc1 — writes its statistics (and
// the residual sum) only, and the linear applies the norm in its FP8 input cast (ForwardOptions::input_norm), so
// the norm's output is never written; the same bytes, the same backward. Not under "layernorm" recompute, an mlp
// recompute (its re-run reads the kept norm output) or a KV-cache forward.
// TransformerBlock (transformer_block.py): the stack of layers + final_layernorm.
// Full activation recompute (config.recompute_granularity == "full"; Megatron's _checkpointed_forward):
//   uniform: this block's layers in groups of recompute_num_layers (the last group may be shorter);
//   block:   each of the first recompute_num_layers layers of this block (pipeline stage / virtual chunk)
//            on its own, the rest not recomputed.
// A recomputed group keeps only its input tensor and a copy of the RNG streams taken before it; its layer
// contexts are dropped right after the forward. Backward re-runs the group's forward from the kept input
// with the copied RNG (same dropout keys, hence the same masks and bitwise the same activations) just
// before back-propagating through the group, then drops each layer context after its backward. FP8 linears re-run
// with the scales the first forward cast with and leave their scaling state alone (tensor_parallel/fp8_recompute.h;
// both full and mlp / moe recompute), so the state is updated once per microbatch.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "mcpp/transformer/activation_dims.h"
#include "mcpp/transformer/moe/moe_layer.h"
#include "mcpp/transformer/norms.h"
#include "mcpp/transformer/spec.h"

namespace mcpp {

struct TransformerLayerCtx {
  NormCtx input_layernorm;
  SubmoduleCtx self_attention;  // the attention's context (SelfAttentionCtx, MLASelfAttentionCtx, ...)
  NormCtx pre_mlp_layernorm;
  SubmoduleCtx mlp;  // the MLP's context (MLPCtx, moe::MoELayerCtx, ...)
  Tensor mlp_input;  // selective recompute of the mlp / moe: its input (pre_mlp_layernorm's output; not kept
                     // under "layernorm" too); mlp stays empty between forward and backward
  // Every tensor this context keeps alive (the activation-memory walk).
  void for_each_tensor(const TensorVisitor& f) const;
  bool mlp_dropped = false;    // ... the mlp / moe context dropped after the forward
  bool norms_dropped = false;  // selective recompute "layernorm": the two norms' outputs released after the forward
  bool input_norm_in_cast = false, mlp_norm_in_cast = false;  // FP8: the norms applied in the linears' casts
  tensor_parallel::RngTracker mlp_rng;  // ... and for a MoE layer the RNG streams its router found (the re-run draws
  bool has_mlp_rng = false;             // the same jitter and random logits from this copy)
  tensor_parallel::Fp8ScaleStash mlp_fp8;  // ... and the scales its FP8 linears cast with (fp8_recompute.h)
  PhiloxKey mlp_dropout_key;
  bool dropout = false;
};

// The residual stream between layers: the value a, or a + dropout(b) left unsummed for the next norm to add
// (b defined; drop inactive = no dropout). sum() materializes it (dropout, then a separate add, into b's
// storage).
struct Residual {
  Tensor a, b;
  ops::ResidualDropout drop{};
  Tensor sum();
};

// The gradient of a Residual: sum = that of a and of the sum; branch = that of b where the consuming norm
// dropped b in its kernels, else undefined (b's producer applies its dropout backward to sum itself).
struct ResidualGrad {
  Tensor sum, branch;
};

class TransformerLayer {
 public:
  // Saved activations of one microbatch's forward without the layer input (the caller counts it: the stage input
  // or the previous layer's fused sum); the memory planner sums these (activation_dims.h): the two norms'
  // statistics, linear_qkv's input n*h*e (the norm output, gathered under SP), the attention's, x1 = x + attention
  // n_l*h*e, and the MLP's or the MoE layer's; selective "mlp" / "moe" keeps only the MLP's input n_l*h*e.
  static int64_t saved_bytes(const TransformerConfig& config, const ActivationDims& d, bool moe);
  // expert_params: where a MoE layer registers its experts (the model's one buffer at EP 1; moe_layer.h).
  // spec: this layer's parts (a MoE layer's spec builds a MoELayer as its MLP).
  TransformerLayer(ParameterRegistry& params, ParameterRegistry& expert_params, const std::string& prefix,
                   const TransformerConfig& config, const TransformerLayerSpec& spec,
                   const tensor_parallel::TPContext& tp);
  // x: the layer input (an unsummed one is added inside input_layernorm). Returns y unsummed: {x1, mlp}.
  Residual forward(TransformerLayerCtx& ctx, const Residual& x, const RopeTables* rope,
                   const ForwardOptions& opt) const;
  // loss_grad_scale: the coefficient of this microbatch's loss in the backward (MoE: the router's load-balancing
  // losses are back-propagated with it, as Megatron's MoEAuxLossAutoScaler).
  ResidualGrad backward(TransformerLayerCtx& ctx, const ResidualGrad& dy, const RopeTables* rope,
                        float loss_grad_scale) const;
  moe::MoELayer* moe_layer() const { return mlp_->moe_layer(); }  // null in a dense layer

 private:
  float hidden_dropout_;
  bool sequence_parallel_;
  Norm input_layernorm_;
  std::unique_ptr<AttentionModule> self_attention_;
  Norm pre_mlp_layernorm_;
  std::unique_ptr<MlpModule> mlp_;
  bool recompute_mlp_;                  // recompute_modules "mlp" (dense) / "moe" (MoE layer)
  bool recompute_norms_;                // recompute_modules "layernorm"
  std::string name_;                    // "decoder.layers.<i>": the NVTX range and module trace name
};

// One group of layers [first, first + count) whose contexts are rebuilt in backward.
struct RecomputeGroup {
  int64_t first = 0, count = 0;
};

// Megatron's full-recompute plan for a block of n layers (TransformerConfig fields; validated there): none
// unless recompute_granularity is "full"; uniform: groups of recompute_num_layers (the last may be shorter);
// block: each of the first recompute_num_layers layers alone. The memory planner reads the same plan.
std::vector<RecomputeGroup> recompute_plan(const TransformerConfig& c, int64_t n);

struct RecomputeState {
  Tensor input;          // [s(/tp), b, h] the group's input, kept
  ForwardReplay replay;  // training flag + the RNG streams before the group's forward
  tensor_parallel::Fp8ScaleStash fp8;  // the scales the group's FP8 linears cast with (fp8_recompute.h)
};

struct TransformerBlockCtx {
  std::vector<TransformerLayerCtx> layers;  // recomputed groups' entries are empty between forward and backward
  std::vector<RecomputeState> recompute;    // one per RecomputeGroup of the block
  NormCtx final_layernorm;
};

class TransformerBlock {
 public:
  // Builds layers [first_layer, first_layer + num_layers) named decoder.layers.<global index>; the final
  // norm only when post_process (the last pipeline stage holds it).
  // spec.layer_specs: one per layer of the model (global index; at least first_layer + num_layers).
  TransformerBlock(ParameterRegistry& params, ParameterRegistry& expert_params, const TransformerConfig& config,
                   const TransformerBlockSpec& spec, const tensor_parallel::TPContext& tp, int64_t first_layer,
                   int64_t num_layers, bool post_process);
  Tensor forward(TransformerBlockCtx& ctx, const Tensor& x, const RopeTables* rope, const ForwardOptions& opt) const;
  Tensor backward(TransformerBlockCtx& ctx, const Tensor& dy, const RopeTables* rope, float loss_grad_scale) const;
  const std::vector<RecomputeGroup>& recompute_groups() const { return groups_; }
  // The routers of this block's MoE layers, in layer order (the trainer updates their expert biases).
  std::vector<moe::TopKRouter*> routers() const;

 private:
  // Runs layers [first, first + count) from x into ctx.layers; returns the last output (unsummed).
  Residual forward_layers(TransformerBlockCtx& ctx, int64_t first, int64_t count, Residual x,
                          const RopeTables* rope, const ForwardOptions& opt) const;
  std::vector<std::unique_ptr<TransformerLayer>> layers_;
  std::vector<RecomputeGroup> groups_;
  std::unique_ptr<Norm> final_layernorm_;
};

}  // namespace mcpp
