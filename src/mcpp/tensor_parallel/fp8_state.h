// FP8 scaling state of one tensor-parallel linear (Megatron-Core + Transformer Engine's recipes, per tensor):
// the input x, the weight w and the output gradient dy each carry a scale [2] = {scale, 1/scale} and an amax history
// [L] (float32 on the layer's device; created on the CPU, moved at the first forward), updated on the device with
// ops::fp8_scale_update — no host read, so CUDA graphs may capture it.
//
//   delayed (--fp8-recipe delayed, Transformer Engine's DelayedScaling): a cast uses the scale computed from the
//       history of earlier calls and records its amax into history[0]; right after each forward (x, w) and each
//       backward (dy) the update takes amax = max(history) (--fp8-amax-compute-algo max) or history[0]
//       (most_recent), rolls the history and sets scale = (fp8_max / amax) / 2^margin. Initial scale 1.
//   tensorwise (--fp8-recipe tensorwise, current scaling): the amax of the tensor itself is taken first (one more
//       read), then the same update with a one-slot history, then the cast: scale = (fp8_max / amax(x)) / 2^margin.
// With tp > 1 each new amax is all-reduced (MAX) over the TP group before the update (Transformer Engine's amax
// reduction), so every TP rank holds the scales of the unsplit tensors (those of a tp = 1 run). Not over DP: each
// DP replica keeps scales from its own data (the weights stay in sync; the scales need not).
//   blockwise (--fp8-recipe blockwise, DeepSeek-V3's; Transformer Engine's Float8BlockScaling): each GEMM operand is
//       scaled per 1x128 tile (x, dy) or 128x128 block (w) inside the op (ops.h Fp8Block), from the tensor itself:
//       nothing is kept between calls — no scale, no history, nothing in the checkpoint (state_tensors() is empty),
//       nothing reduced over TP (a block's scale depends on its own elements only), nothing for a recompute re-run to
//       replay (the same input gives the same scales).
// Formats: --fp8-format e4m3 casts all three as e4m3; hybrid casts dy as e5m2 (more range for gradients). Blockwise
// follows the same flag (Megatron passes it to Transformer Engine's Float8BlockScaling): DeepSeek-V3's recipe is
// --fp8-format e4m3 (e4m3 everywhere), hybrid gives e5m2 gradient tiles.
// The forward's x / w scales are what the backward must cast with (the update after the forward changes them):
// forward() returns copies the caller keeps in its context (ParallelLinearCtx). A recomputed region's re-run casts
// with the copies its first forward stashed (replayed(): no amax, no update; fp8_recompute.h).
// Checkpoints: state_tensors() names every tensor ("<prefix>.fp8.{input,weight,grad_output}.{scale,amax_history}");
// training/checkpointing saves them per rank, so a resume continues bit-exactly.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "mcpp/comm/communicator.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/tensor_parallel/fp8_options.h"

namespace mcpp::tensor_parallel {

// One tensor's scaling state.
struct Fp8TensorMeta {
  Tensor scale;         // [2] {scale, scale_inv}
  Tensor amax_history;  // [L]; history[0] is the slot the current step records into
  ops::Fp8Format format = ops::Fp8Format::E4M3;
};

class Fp8LinearState {
 public:
  Fp8LinearState(const Fp8Options& opt, const std::string& prefix, comm::CommPtr tp);

  struct Forward {
    ops::Fp8Operand x, w;    // to cast with now (the amax slots set where the cast records them)
    Tensor x_scale, w_scale;  // the copies for the backward
  };
  // Before the forward GEMM of x [n, in] and w [out, in] (tensorwise: takes their amax and sets the scales now).
  Forward forward(const Tensor& x, const Tensor& w);
  // The operands of a recompute re-run: the first forward's scales, no amax slot (the state is left alone).
  Forward replayed(const Tensor& x_scale, const Tensor& w_scale) const;
  void after_forward();  // delayed: the x and w updates (after the GEMM recorded their amax)
  ops::Fp8Operand backward(const Tensor& dy);  // before the backward GEMMs (tensorwise: dy's scale now)
  void after_backward();                       // delayed: the dy update

  // Every state tensor with its checkpoint key (the tensors themselves: a load writes into them).
  std::vector<std::pair<std::string, Tensor*>> state_tensors();
  const std::string& prefix() const { return prefix_; }
  bool blockwise() const { return opt_.recipe == Fp8Recipe::Blockwise; }
  bool delayed() const { return opt_.recipe == Fp8Recipe::Delayed; }
  ops::Fp8Format grad_format() const { return grad_.format; }

 private:
  void to_device(Device d);
  void reduce_amax(Fp8TensorMeta& m);          // MAX over the TP group of history[0]
  void update(Fp8TensorMeta& m);               // reduce, then ops::fp8_scale_update
  ops::Fp8Operand prepare(Fp8TensorMeta& m, const Tensor& t);  // tensorwise: amax + update; the operand

  Fp8Options opt_;
  std::string prefix_;
  comm::CommPtr tp_;
  Fp8TensorMeta input_, weight_, grad_;
};

}  // namespace mcpp::tensor_parallel
