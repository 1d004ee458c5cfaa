// FP8 under activation recompute (Transformer Engine's fp8 recompute phase): a recomputed region's re-run must cast
// with the scales its first forward used and must not touch the scaling state (no amax recorded, no update), so
// the state is updated once per microbatch forward and the re-run's activations are bitwise the first forward's
// (delayed scaling: later microbatches' forwards have moved the live scales since; tensorwise: the scale would come
// out the same, but the re-run would update the state a second time).
//
// The caller that drops a region's contexts owns an Fp8ScaleStash per region and microbatch beside the region's
// kept input (TransformerBlock's RecomputeState for full recompute; TransformerLayerCtx for recompute of the
// mlp / moe; MoELayerCtx for shared_experts; the MTP depth's context) and passes an Fp8Recompute down the forward
// (ForwardOptions::fp8_recompute, then the linears' forward argument):
//   first forward: record = {the region's stash} (plus the enclosing regions' stashes): every FP8 linear appends
//                  the {x, w} scales it cast with, in call order;
//   re-run:        replay = the region's stash: every FP8 linear takes the next entry (checked to be its own) and
//                  casts with it. Nested regions (full recompute of a layer whose MLP is recomputed too): the outer
//                  re-run replays the outer stash while recording the inner one, which the MLP's own re-run (in
//                  the layer's backward) then replays.
// Per-call scales (blockwise) have nothing to carry: a linear whose recipe keeps no state records and takes none.
#pragma once
#include <string>
#include <vector>

#include "mcpp/core/tensor.h"

namespace mcpp::tensor_parallel {

// The scales [2] the FP8 linears of one recomputed region cast x and w with in its first forward, in call order.
class Fp8ScaleStash {
 public:
  struct Entry {
    const void* owner = nullptr;  // the linear's Fp8LinearState (the re-run checks the order)
    Tensor x_scale, w_scale;
  };
  void push(const void* owner, const Tensor& x_scale, const Tensor& w_scale);
  // The next entry, which must be `owner`'s (name: the linear, for the error).
  const Entry& take(const void* owner, const std::string& name);
  size_t size() const { return entries_.size(); }
  bool consumed() const { return next_ == entries_.size(); }

 private:
  std::vector<Entry> entries_;
  size_t next_ = 0;
};

// What the FP8 linears of a forward do with their scales (null pointer / empty: a plain forward).
struct Fp8Recompute {
  Fp8ScaleStash* replay = nullptr;     // a re-run: cast with the stashed scales, leave the state alone
  std::vector<Fp8ScaleStash*> record;  // a first forward of recomputed region(s): append the scales used
  // `outer` (may be null) with `stash` recorded into as well: the options of a recomputed region's first forward.
  static Fp8Recompute recording(const Fp8Recompute* outer, Fp8ScaleStash& stash);
  // The options of a re-run that replays `stash` (and records nothing).
  static Fp8Recompute replaying(Fp8ScaleStash& stash) { return {.replay = &stash, .record = {}}; }
};

}  // namespace mcpp::tensor_parallel
