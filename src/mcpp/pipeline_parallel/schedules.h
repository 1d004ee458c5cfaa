// Pipeline schedules as data — the op sequence Megatron-Core's schedules run on one pipeline rank
// (megatron/core/pipeline_parallel/schedules.py: forward_backward_no_pipelining,
// forward_backward_pipelining_without_interleaving, forward_backward_pipelining_with_interleaving,
// get_forward_backward_func).
//
// A Schedule is the ordered list of Actions one rank executes in one training step:
//   Forward(microbatch, chunk) / Backward(microbatch, chunk) — compute on model chunk `chunk`
//     (chunk = virtual pipeline stage, 0 without interleaving);
//   Comm — one batched P2P call (Megatron's _communicate): up to four ops, each naming the tensor it
//     moves as (microbatch, chunk):
//       send_next  activation of Forward(mb, c) of this rank  -> rank (r+1) % pp
//       send_prev  input grad of Backward(mb, c) of this rank -> rank (r-1+pp) % pp
//       recv_prev  activation this rank's Forward(mb, c) will consume
//       recv_next  output grad this rank's Backward(mb, c) will consume
//     Ops Megatron skips (no-op on the first / last stage, recv_prev=False, a None tensor) are left out;
//     a Comm with no op is not emitted. comm_name() gives Megatron's name for the op set:
//     recv_forward, send_forward, recv_backward, send_backward, send_forward_recv_backward,
//     send_backward_recv_forward, send_forward_recv_forward, send_backward_recv_backward,
//     send_forward_backward_recv_forward_backward (and partial combinations of the last one).
// With interleaving the P2P neighbours form a ring: rank pp-1's chunk-c output feeds rank 0's chunk c+1,
// and rank 0's chunk-c input grad feeds rank pp-1's chunk c-1 (as in Megatron).
//
// Pure computation (no communicator, no tensors): the trainer walks the list; simulator.h checks
// global consistency and computes bubble / in-flight counts. Bad (pp, rank, M, V, group size) throws
// mcpp::Error naming the field.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mcpp::pipeline_parallel {

struct TensorId {
  int64_t microbatch = 0;
  int64_t chunk = 0;
  bool operator==(const TensorId&) const = default;
};

enum class ActionKind { Forward, Backward, Comm };

struct Action {
  ActionKind kind = ActionKind::Forward;
  int64_t microbatch = -1;  // Forward / Backward only
  int64_t chunk = -1;       // Forward / Backward only
  std::optional<TensorId> send_next, send_prev, recv_prev, recv_next;  // Comm only
  bool operator==(const Action&) const = default;

  static Action forward(int64_t mb, int64_t chunk) { return {ActionKind::Forward, mb, chunk, {}, {}, {}, {}}; }
  static Action backward(int64_t mb, int64_t chunk) { return {ActionKind::Backward, mb, chunk, {}, {}, {}, {}}; }
};

using Schedule = std::vector<Action>;

// Megatron's P2P function name for a Comm action's op set ("" for compute actions).
std::string comm_name(const Action& a);
// "F3.1", "B0.0", "send_forward_recv_backward(sn=3.0,rn=1.0)" — ops in order sn, sp, rp, rn.
std::string to_string(const Action& a);
std::string to_string(const Schedule& s);  // actions joined by ' '

struct ScheduleOptions {
  int64_t pipeline_model_parallel_size = 1;
  int64_t pipeline_model_parallel_rank = 0;
  int64_t num_microbatches = 1;
  int64_t virtual_pipeline_model_parallel_size = 1;  // model chunks per rank; 1 = no interleaving
  int64_t microbatch_group_size_per_vp_stage = 0;    // 0 -> pipeline_model_parallel_size (Megatron's default)
  bool forward_only = false;                         // evaluation: forwards only, no grads
};

enum class ScheduleKind { NoPipelining, WithoutInterleaving, WithInterleaving };

// get_forward_backward_func: pp > 1 and V > 1 -> interleaved; pp > 1 -> 1F1B; pp == 1 -> no pipelining.
ScheduleKind get_forward_backward_func(const ScheduleOptions& opt);
std::string to_string(ScheduleKind k);

// Checks sizes and rank; with V > 1 also Megatron's interleaving constraints:
//   pp <= microbatch_group_size_per_vp_stage <= num_microbatches, and
//   num_microbatches % group_size == 0 or >= pp (with the default group size: M % pp == 0, M >= pp).
void validate_schedule_options(const ScheduleOptions& opt);

// Warmup forwards on this rank (in chunk-microbatches, i.e. units of Forward actions):
//   1F1B: min(pp - rank - 1, M); interleaved: min((pp - rank - 1) * 2 + (V - 1) * group, M * V);
//   forward-only interleaved: M * V. (1F1B forward-only keeps the 1F1B warmup, as Megatron does.)
int64_t num_warmup_microbatches(const ScheduleOptions& opt);

// Activations held for backward at the peak on this rank, in (microbatch, chunk) units (a chunk holds
// 1/V of the rank's layers): training: min(warmup + 1, M * V) — pp - rank (capped by M) for 1F1B, 1 for
// no pipelining; forward-only: 0. simulator_test checks it against the simulated schedules.
int64_t max_activations_in_flight(const ScheduleOptions& opt);

Schedule forward_backward_no_pipelining(const ScheduleOptions& opt);
Schedule forward_backward_pipelining_without_interleaving(const ScheduleOptions& opt);
Schedule forward_backward_pipelining_with_interleaving(const ScheduleOptions& opt);

// The schedule get_forward_backward_func selects, for this rank.
Schedule build_schedule(const ScheduleOptions& opt);
// All ranks' schedules (opt.pipeline_model_parallel_rank is ignored): [pp] lists.
std::vector<Schedule> build_all_schedules(const ScheduleOptions& opt);

// Megatron's interleaved lookup table: virtual_microbatch_id -> (microbatch, forward chunk), [M * V].
std::vector<TensorId> interleaved_schedule_table(int64_t num_microbatches, int64_t num_model_chunks,
                                                 int64_t microbatch_group_size_per_vp_stage);

}  // namespace mcpp::pipeline_parallel
