// Tensor-parallel layers (Megatron-Core tensor_parallel/layers.py). Weights use Megatron's layout
// W[out, in]; each registers its parameter with a TensorShard describing its place in the logical
// tensor, so initialization and checkpoints are layout-independent.
//
// ColumnParallelLinear: W split on the output dim, W_r [out/tp, in].
//   fwd: x [s(/tp), b, in] -> (SP: all-gather on s | else copy_to_tp: identity) -> y [s, b, out/tp] (+ b_r)
//   bwd: dx = dy W_r (partial) -> (SP: reduce-scatter to [s/tp] | else all-reduce); dW_r, db_r accumulate.
//        With tp > 1 the reduction is posted asynchronously right after the dgrad GEMM and overlaps the
//        wgrad GEMM (Megatron's async grad communication); it is waited before dx is returned.
//   stride_chunks > 1 splits the output dim into that many logical chunks, each partitioned over TP and
//   kept together locally (SwiGLU fc1: [gate | up], each rank holds [gate_r | up_r]).
// RowParallelLinear: W split on the input dim, W_r [out, in/tp]; the input is already TP-parallel.
//   fwd: y_partial = x_r W_r^T -> (SP: reduce-scatter to [s/tp] | else all-reduce) -> + b (replicated,
//        added after the reduction) -> [s(/tp), b, out]
//   bwd: dy -> (SP: all-gather to [s]) -> dx_r = dy W_r; dW_r += dy^T x_r; db += sum(dy over all s)
//        (complete on every rank, so the bias needs no TP grad all-reduce).
// Parameter grads accumulate into main_grad; activation grads are returned.
// tp_comm_overlap (Megatron's --tp-comm-overlap; sequence parallel only): the SP all-gathers that feed a
// GEMM — ColumnParallel's input in forward / forward_gelu, RowParallel's dy in backward / backward_dgelu —
// run as a ring over the TP group (mappings.h all_gather_sp_ring): each chunk's GEMM rows (the dgrad for
// RowParallel; its wgrad then runs on the whole gathered dy) overlap the next chunk's P2P transfer; and
// RowParallel's forward GEMM + reduce-scatter as a ring (reduce_scatter_sp_ring): each destination chunk's
// partial GEMM overlaps the transfer of the previous running sum. Same results up to the GEMMs' row
// blocking and the order of the TP sum.
//
// The GELU MLP's fused pair (Transformer Engine's LayerNormMLP, ops linear_gelu_fwd / linear_dgelu_bwd),
// with the same collectives in the same places as forward/backward:
//   ColumnParallelLinear::forward_gelu: act = gelu(x W_r^T + b_r) [s, b, out/tp] in one GEMM; also writes
//     pre_act [s*b, out/tp] (the caller keeps it for backward).
//   RowParallelLinear::backward_dgelu: backward() whose dgrad GEMM also applies gelu'(pre_act); returns
//     dpre [s, b, in/tp]. fc1's bias grad then comes from fc1's own backward (on CUDA in the BGRADB epilogue
//     of its weight-grad GEMM, so no extra pass over dpre).
//
// FP8 (ParallelLinearOptions::fp8 enabled; Megatron's --fp8-format with Transformer Engine's linear): the forward,
// dgrad and wgrad GEMMs run as ops::fp8_linear_fwd / fp8_linear_bwd with the layer's scaling state
// (fp8_state.h: x, w, dy per tensor), the same collectives in the same places; the bias is added after the GEMM;
// forward_gelu / backward_dgelu apply GELU / GELU' as separate ops around the FP8 GEMMs; the column-parallel dgrad's
// reduction then waits for the wgrad (one fp8_linear_bwd call computes both). Not with tp_comm_overlap. Under
// activation recompute the forwards take an Fp8Recompute (fp8_recompute.h): a re-run casts with the first forward's
// scales and updates no state. The forward keeps q(x)^T and q(w)^T (ops.h Fp8Saved) and drops x: the backward casts
// only dy (recompute_output, which needs x, is for MLA's up-projections, which have no FP8).
#pragma once
#include <memory>
#include <string>

#include "mcpp/comm/communicator.h"
#include "mcpp/core/parameter.h"
#include "mcpp/tensor_parallel/fp8_recompute.h"
#include "mcpp/tensor_parallel/fp8_state.h"


namespace mcpp::tensor_parallel {

struct ParallelLinearOptions {
  int64_t input_size = 0;   // logical (unpartitioned) sizes
  int64_t output_size = 0;
  bool bias = true;
  float init_std = 0.02f;
  bool sequence_parallel = false;
  bool tp_comm_overlap = false;  // with sequence_parallel: the all-gather + GEMM as a ring (see the header)
  int64_t stride_chunks = 1;  // ColumnParallelLinear only
  // An expert's linear under expert tensor parallelism (Megatron's is_expert -> explicit_expert_comm): the
  // group only shards the weight; the layer runs no collective — the MoE token dispatcher all-gathers the
  // experts' inputs over expert-TP and reduce-scatters their outputs (transformer/moe/token_dispatcher.h). Column: x is
  // every expert-TP rank's whole input, dx is returned partial. Row: the output is partial; the replicated bias
  // is added on group rank 0 only (the reduce-scatter then adds it once) and its grad, from the gathered dy,
  // is complete on every rank. Needs sequence_parallel = false.
  bool explicit_expert_comm = false;
  Fp8Options fp8{};  // FP8 GEMMs (fp8.enabled; see the header)
};

struct ParallelLinearCtx {
  // [n, in_local] input to the GEMM (after the SP all-gather for column parallel). FP8 per-tensor recipes drop it
  // after the forward: the backward reads fp8_saved instead (Transformer Engine keeps only the fp8 copy too).
  Tensor x;
  int64_t rows = 0;                 // n, kept when x is dropped
  Tensor fp8_x_scale, fp8_w_scale;  // FP8: the scales [2] the forward cast x and w with (the backward's)
  ops::Fp8Saved fp8_saved;          // FP8: the forward's casts of x and w for the backward (ops.h); freed by it
};

class ColumnParallelLinear {
 public:
  ColumnParallelLinear(ParameterRegistry& params, const std::string& prefix, const ParallelLinearOptions& opt,
                       comm::CommPtr tp);
  // Shares an existing weight (tied output layer = word embeddings); no parameters registered.
  ColumnParallelLinear(Parameter* shared_weight, const ParallelLinearOptions& opt, comm::CommPtr tp);
  // fp8_recompute: FP8 under activation recompute (fp8_recompute.h; null: a plain forward). x_norm (null: none):
  // x is a norm's input and the layer's input its output, applied in the FP8 input cast (ops.h Fp8Act::Norm;
  // Transformer Engine's LayerNormLinear), so the norm's output is never written (fp8_fuses_norm() only).
  Tensor forward(ParallelLinearCtx& ctx, const Tensor& x, const Fp8Recompute* fp8_recompute = nullptr,
                 const ops::Fp8Norm* x_norm = nullptr) const;
  // act [s, b, out/tp] = gelu(forward(x)); pre_act is set to the pre-activation [s*b, out/tp].
  Tensor forward_gelu(ParallelLinearCtx& ctx, const Tensor& x, Tensor& pre_act,
                      const Fp8Recompute* fp8_recompute = nullptr) const;
  // pre_act (null: none): dy is the gradient of act(this layer's output), pre_act [s*b, out/tp] that output, and the
  // layer's own gradient, dy * gelu'(pre_act) (dy_act DGelu) or swiglu_bwd(dy [s, b, out/2tp], pre_act) (DSwiglu), is
  // taken in the FP8 gradient cast (fp8_fuses_act() only).
  Tensor backward(ParallelLinearCtx& ctx, const Tensor& dy, const Tensor* pre_act = nullptr,
                  ops::Fp8Act dy_act = ops::Fp8Act::DGelu) const;
  // FP8 delayed scaling: an activation can ride in the FP8 casts (the scale is known before the tensor is read).
  bool fp8_fuses_act() const { return fp8_ && fp8_->delayed(); }
  // ... and the input's norm, where x is not all-gathered between the norm and the cast (no SP).
  bool fp8_fuses_norm() const { return fp8_fuses_act() && !opt_.sequence_parallel; }
  // Sets ctx's saved input again from x, the forward's input recomputed (selective recompute "layernorm": the
  // caller dropped ctx.x after the forward): under SP the all-gather again (a plain one with --tp-comm-overlap too:
  // the same rows), no GEMM.
  void restore_input(ParallelLinearCtx& ctx, const Tensor& x) const;
  // The forward's output again from ctx's kept input, [n, out/tp] (recompute of the output, MLA's "mla_up_proj"): the
  // same GEMMs on the same row blocks (per TP chunk under --tp-comm-overlap, as the ring ran them), bias included —
  // bitwise the forward's output; no communication.
  Tensor recompute_output(const ParallelLinearCtx& ctx) const;
  int64_t output_size_per_partition() const { return out_local_; }
  // A shared weight reports grad_ready only where its last use is here (see GPTModel's tied embeddings).
  void set_reports_weight_grad(bool on) { owns_weight_ = on; }
  Parameter* weight() const { return weight_; }

 private:
  comm::CommPtr tp_;
  ParallelLinearOptions opt_;
  int64_t out_local_ = 0;
  Parameter* weight_ = nullptr;
  Parameter* bias_ = nullptr;
  bool owns_weight_ = true;  // a shared (tied) weight reports grad_ready at its other, last use
  std::string name_;         // the module's name (its parameters' prefix): NVTX range and module trace
  std::shared_ptr<Fp8LinearState> fp8_;  // FP8 scaling state; null without FP8
};

class RowParallelLinear {
 public:
  RowParallelLinear(ParameterRegistry& params, const std::string& prefix, const ParallelLinearOptions& opt,
                    comm::CommPtr tp);
  // x [s, b, in/tp]; fp8_recompute as ColumnParallelLinear's. x_act Gelu: the layer's input is gelu(x), applied in
  // the FP8 input cast, so gelu(x) is never written; Swiglu: x [s, b, 2 in/tp] is [gate | up] and the input
  // swiglu(x) (fp8_fuses_act() only).
  Tensor forward(ParallelLinearCtx& ctx, const Tensor& x, const Fp8Recompute* fp8_recompute = nullptr,
                 ops::Fp8Act x_act = ops::Fp8Act::None) const;
  bool fp8_fuses_act() const { return fp8_ && fp8_->delayed(); }  // as ColumnParallelLinear's
  // -> dx [s, b, in/tp]. bias_grad_elsewhere: the caller has taken (or takes) the bias grad and its
  // grad_ready from the residual stream (residual_bias()); only dx and the weight grad here.
  Tensor backward(ParallelLinearCtx& ctx, const Tensor& dy, bool bias_grad_elsewhere = false) const;
  // backward() with the input's GELU folded in: -> dpre [s, b, in/tp] = dx * gelu'(pre_act [s*b, in/tp]).
  Tensor backward_dgelu(ParallelLinearCtx& ctx, const Tensor& dy, const Tensor& pre_act,
                        bool bias_grad_elsewhere = false) const;
  // The bias whose grad (the column sums of dy) a caller may take where dy is already read or written (a
  // fused add + norm backward): set when there is a bias and dy is this rank's whole [s, b, out] gradient
  // (no sequence parallelism: with it the grad sums the all-gathered dy).
  Parameter* residual_bias() const {
    return opt_.sequence_parallel || opt_.explicit_expert_comm ? nullptr : bias_;
  }

 private:
  comm::CommPtr tp_;
  ParallelLinearOptions opt_;
  int64_t in_local_ = 0;
  Parameter* weight_ = nullptr;
  Parameter* bias_ = nullptr;
  std::string name_;  // the module's name (its parameters' prefix): NVTX range and module trace
  std::shared_ptr<Fp8LinearState> fp8_;  // FP8 scaling state; null without FP8
};

// The TensorShard of a dim-`dim` split of `global` into tp parts (stride_chunks logical chunks each
// split separately), for TP rank `rank`.
TensorShard tp_shard(const Shape& global, int dim, int tp_size, int tp_rank, int64_t stride_chunks = 1);

}  // namespace mcpp::tensor_parallel
