// What every module's forward needs besides its input: training vs eval (dropout on/off) and the RNG
// tracker dropout draws from. Explicit forward/backward (DESIGN.md decision 1): a module's saved state
// lives in a *Ctx struct the caller owns (one per microbatch per chunk); backward reads it.
#pragma once
#include "mcpp/kernels/ops.h"
#include "mcpp/tensor_parallel/fp8_recompute.h"
#include "mcpp/tensor_parallel/random.h"
#include "mcpp/transformer/packed_seq_params.h"

namespace mcpp {
namespace moe {
struct LossTracker;
}
class MtpLossTracker;
class InferenceContext;

struct ForwardOptions {
  bool training = true;                       // dropout active when true and p > 0
  tensor_parallel::RngTracker* rng = nullptr;  // dropout streams; required when training with dropout
  // > 0: the backward will follow with this grad_scale, so the last stage computes the logits' gradient in
  // the loss forward (fused cross entropy, one pass over the logits; tp = 1). 0: the loss only.
  float loss_grad_scale = 0.0f;
  // MoE layers add their router losses here (the trainer's log line); null = not recorded (evaluation, recompute).
  moe::LossTracker* moe_losses = nullptr;
  // Multi-token prediction depths add each microbatch's mean loss here (the trainer's log line); null = not recorded.
  MtpLossTracker* mtp_losses = nullptr;
  // Generation with a KV cache (transformer/inference_context.h): the attention layers read and extend its
  // key/value memory (prefill or decode step); null = the plain forward over the whole sequence.
  InferenceContext* inference = nullptr;
  // Packed sequences (packed_seq_params.h), on the model's device: the core attention masks by documents
  // (doc_start). The positions are the model's concern (GPTModel's rotary tables and learned positions). Null: none.
  const PackedSeqParams* packed_seq_params = nullptr;
  // FP8 under activation recompute (tensor_parallel/fp8_recompute.h): a recomputed region's first forward records the
  // scales its FP8 linears cast with, its re-run replays them. Null: a plain forward.
  const tensor_parallel::Fp8Recompute* fp8_recompute = nullptr;
  // The module's input x is a norm's input, not its output: the module's first linear applies this norm in its FP8
  // input cast (ops.h Fp8Act::Norm; Transformer Engine's LayerNormLinear), so the norm's output is never written.
  // Set by the layer only for a module whose fuses_input_norm() (transformer/spec.h); null: x is the input.
  const ops::Fp8Norm* input_norm = nullptr;
};

// ForwardOptions snapshot for activation recompute: the RNG streams as a forward found them. A re-run
// with options() draws the same dropout keys as the original forward (so the same masks) and advances
// only this snapshot's copy, never the live streams. Take a fresh copy of the snapshot per re-run.
struct ForwardReplay {
  bool training = false;
  bool has_rng = false;
  tensor_parallel::RngTracker rng;
  PackedSeqParams packed{};  // a copy of the forward's (the tensors are shared, not copied)
  static ForwardReplay of(const ForwardOptions& o) {
    ForwardReplay r{.training = o.training, .has_rng = o.rng != nullptr, .rng = {}, .packed = {}};
    if (o.rng) r.rng = *o.rng;
    if (o.packed_seq_params) r.packed = *o.packed_seq_params;
    return r;
  }
  ForwardOptions options() {
    return {.training = training,
            .rng = has_rng ? &rng : nullptr,
            .packed_seq_params = packed.defined() ? &packed : nullptr};
  }
};

inline bool dropout_active(const ForwardOptions& opt, float p) { return opt.training && p > 0.0f; }

}  // namespace mcpp
