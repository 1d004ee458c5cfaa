// FP8 scaling state of one tensor-parallel linear (Megatron-Core + Transformer Engine's recipes, per tensor):
// the input x, the weight w and the output gradient dy each carry a scale [2] = {scale, 1/scale} and an amax history
// [L] (float32 on the layer's device; created on the CPU, moved at the first forward), updated on the device with
// ops::fp8_scale_update — no host read, so CUDA graphs may capture it. In a model the delayed updates of all its
// linears run together at the end of each pass (Fp8UpdateGroup below; Fp8Options::updates), with the same result.
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
#include <memory>
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
  Tensor amax_history;  // [L]; history[0] is the slot the current step records into (in a group: stays 0)
  ops::Fp8Format format = ops::Fp8Format::E4M3;
  int group_slot = -1;  // its amax slot in the model's Fp8UpdateGroup (-1: none; it records into history[0])
};

// The delayed-scaling updates of one model chunk's FP8 linears, launched together (Transformer Engine's
// reduce_and_update_fp8_tensors at the end of each fp8_autocast pass): one amax all-reduce and a few kernel launches
// instead of one (or two, with TP) per tensor. A delayed linear built with Fp8Options::updates registers x and w in
// the forward list and dy in the backward list; its casts record their amax into the list's slot — one contiguous
// fp32 buffer per list — instead of history[0]; the model calls begin() at the start and flush() at the end of each
// forward (backward) pass: the buffer all-reduced over TP (MAX) in one call, then ops::fp8_scale_update_multi for the
// tensors that recorded in that pass. A linear runs once per pass, so none casts with a scale its own pass changed: the scales and histories
// are bit for bit those of the per-linear updates (Fp8LinearState::update). A recompute re-run records nothing.
// The x / w scales a forward pass cast with, which its backward needs, are copied by the same launch into one [k, 2]
// buffer per forward pass (forward_scale), instead of one copy per tensor.
class Fp8UpdateGroup {
 public:
  enum class Pass { Forward, Backward };
  explicit Fp8UpdateGroup(comm::CommPtr tp) : tp_(std::move(tp)) {}
  // Registers m (a meta that lives as long as the group) in the pass's list: its slot. Only before the first pass.
  int add(Pass p, Fp8TensorMeta* m, const ops::Fp8ScalingOptions& opt);
  // The amax slot a cast of this pass records into ([1], a view of the list's buffer on d), marked for the flush.
  Tensor record(Pass p, int slot, Device d);
  // The scale [2] this forward pass casts tensor `slot` with (recorded), for the backward: a view of the pass's
  // copies, written by its flush.
  Tensor forward_scale(int slot);
  // The start of a pass: what a pass that stopped on an error recorded and never flushed is dropped (its slots
  // zeroed), so the next pass starts clean. Nothing recorded: nothing runs.
  void begin(Pass p);
  void flush(Pass p);  // reduce and update what recorded since the last flush; nothing recorded: nothing runs
  const comm::CommPtr& tp() const { return tp_; }

 private:
  struct List {
    std::vector<std::pair<Fp8TensorMeta*, ops::Fp8ScalingOptions>> metas;
    Tensor amax;                    // [metas] on the device, allocated by the first record
    std::vector<int> recorded;      // slots recorded since the last flush, in order
    std::vector<char> marked;       // [metas]: recorded since the last flush
    Tensor before;                  // forward: [metas, 2], the pass's scales as cast with (a new buffer per pass)
  };
  List& list(Pass p) { return lists_[p == Pass::Forward ? 0 : 1]; }
  static Tensor scale_copy(const List& l, int slot) { return l.before.narrow0(slot, 1).view({2}); }  // [2]
  comm::CommPtr tp_;
  List lists_[2];
};

class Fp8LinearState {
 public:
  Fp8LinearState(const Fp8Options& opt, const std::string& prefix, comm::CommPtr tp);
  Fp8LinearState(const Fp8LinearState&) = delete;  // its update group holds pointers to the metas
  Fp8LinearState& operator=(const Fp8LinearState&) = delete;

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
  void update(Fp8TensorMeta& m);               // reduce, then ops::fp8_scale_update (not in a group)
  ops::Fp8ScalingOptions scaling(const Fp8TensorMeta& m) const;  // its update's options
  // tensorwise: amax + update; the operand (in a group: recording into its slot of pass p)
  ops::Fp8Operand prepare(Fp8TensorMeta& m, const Tensor& t, Fp8UpdateGroup::Pass p);

  Fp8Options opt_;
  std::string prefix_;
  comm::CommPtr tp_;
  Fp8TensorMeta input_, weight_, grad_;
  std::shared_ptr<Fp8UpdateGroup> group_;  // opt_.updates (delayed only)
};

}  // namespace mcpp::tensor_parallel
