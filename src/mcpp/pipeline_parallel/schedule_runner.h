// Executes one rank's pipeline Schedule (schedules.h) on its model chunks: the forward_backward_func of
// Megatron-Core, driven by data instead of control flow.
//   Forward(mb, c)   chunk c's forward_step on microbatch mb: input = tokens (first stage) or the
//                    activation received for (mb, c); the last stage computes the loss statistics into
//                    row mb of ScheduleRunResult::loss_stats (on the device: no host sync); other stages keep
//                    their output for the send that follows. The context (saved activations) is held
//                    until Backward(mb, c) — the schedule decides how many are in flight.
//   Backward(mb, c)  chunk c's backward_step with the gradient received for (mb, c) (or the loss scaled by
//                    grad_scale on the last stage); the input gradient is kept for its send.
//   Comm             one batched P2P call on the PP group: activations travel on tag 0 to the next rank,
//                    gradients on tag 1 to the previous one (separate channels, so pp = 2 cannot cross).
// P2P shapes are known from the config: [s(/tp with SP), b, h] — or, with variable_seq_lengths (Megatron's
// _communicate_shapes), every Comm first exchanges the shapes in one batched call: each data send is
// preceded by a [3] int64 host message with its shape on its own tag (2: activation shapes, 3: gradient
// shapes; over the PP group's host communicator), and the receiver allocates from it. Forward-only
// schedules (evaluation) drop each context right after its forward.
// Activation memory: after every Forward the new context's bytes are measured (activation_memory.h, each
// storage once) and the live total (sum over live contexts: different microbatches share no storage) is
// tracked; the run reports its peak, the largest single context and the peak number of live contexts
// (1F1B: pp - rank; interleaved: schedules.h's max_activations_in_flight).
// Optional timing (args.timings): every executed action is appended with its steady-clock start / end;
// a Comm's interval is its whole batch_p2p call including the wait (transfer and waiting for the peer are
// not separable on CPU ranks). With args.device_clock (CUDA) each action also gets two compute-stream marks
// (core/device_clock.h), before its work and after it — for a Comm after the compute stream's wait on the
// P2P, so the interval is the time the device waited for the transfer and the peer. training/timeline.h
// turns these into a trace.
#pragma once
#include <chrono>
#include <functional>
#include <vector>

#include "mcpp/core/device_clock.h"
#include "mcpp/models/gpt/gpt_model.h"
#include "mcpp/parallel_state/parallel_context.h"
#include "mcpp/pipeline_parallel/schedules.h"

namespace mcpp::pipeline_parallel {

struct MicroBatch {
  Tensor tokens, labels, loss_mask;  // [s, b]
  PackedSeqParams packed = {};       // packed sequences (every stage's forward gets them), or none
};

struct ActionTiming {
  Action action;
  std::chrono::steady_clock::time_point start, end;
  int64_t device_start = -1, device_end = -1;  // DeviceClock marks (-1: host timing only)
};

struct ScheduleRunArgs {
  const Schedule* schedule = nullptr;
  std::vector<GPTModel*> chunks = {};  // this rank's model chunks, by virtual stage
  const parallel_state::ParallelContext* pc = nullptr;
  std::function<MicroBatch(int64_t microbatch)> get_batch;
  Shape hidden_shape;              // [s(/tp), b, h] of the P2P tensors (unused with variable_seq_lengths)
  bool variable_seq_lengths = false;  // exchange each P2P tensor's shape first
  DType hidden_dtype = DType::F32;  // the activations' dtype (bf16 with mixed precision)
  Device hidden_device = Device::CPU;
  ForwardOptions forward;          // training (dropout) and the RNG tracker
  float grad_scale = 1.0f;         // 1 / num_microbatches (Megatron's loss scaling per microbatch)
  bool forward_only = false;
  // Called before Backward(mb, c): DDP's no_sync control (the last microbatch of each chunk reduces).
  std::function<void(int64_t microbatch, int64_t chunk)> before_backward;
  std::function<void(int64_t microbatch, int64_t chunk)> before_forward;  // optional (the NaN re-run's probe)
  std::vector<ActionTiming>* timings = nullptr;  // when set: one entry appended per executed action
  DeviceClock* device_clock = nullptr;           // with timings: compute-stream marks around each action
  // [num_microbatches, 2] float32 on hidden_device, written by the last stage (row mb = masked_loss_stats
  // of microbatch mb); undefined: run_schedule allocates it. A CUDA-graph step passes a static buffer.
  Tensor loss_stats = {};
};

struct LossTotals {
  double loss_sum = 0;         // sum over microbatches of each microbatch's mean loss
  double masked_loss_sum = 0;  // sum over microbatches of sum(loss * mask)
  double num_tokens = 0;       // sum over microbatches of sum(mask)
};
// Reads a [M, 2] loss-statistics tensor (one device->host copy); zeros when undefined (not the last stage).
LossTotals loss_totals(const Tensor& loss_stats);

struct ScheduleRunResult {
  Tensor loss_stats;           // [M, 2] (last stage only; else undefined): loss_totals() reads it
  int64_t max_in_flight = 0;   // peak number of held forward contexts
  size_t peak_activation_bytes = 0;  // peak bytes held by all live contexts (measured after each forward)
  size_t max_context_bytes = 0;      // the largest single context right after its forward
};

ScheduleRunResult run_schedule(const ScheduleRunArgs& args);

}  // namespace mcpp::pipeline_parallel
