// Megatron's training timers (megatron/core/timers.py + the names training.py logs) for one rank, by id.
//
// --timing-log-level L (0, 1, 2) switches the timers of level <= L on (Megatron's levels):
//   1  forward-backward (zero_grad + the schedule's forwards and backwards + the DP grad sync), all-grads-sync
//      (DistributedDataParallel::finish_grad_sync: the DP all-reduce / reduce-scatter's exposed part),
//      layernorm-grads-all-reduce (sequence-parallel norm grads over TP), embedding-grads-all-reduce (tied embeddings
//      over the first / last stage), optimizer (grad norm + clip + Adam + params-all-gather), its parts
//      optimizer-clip-main-grad (the global grad norm; the clip is folded into the Adam kernel) and
//      optimizer-inner-step (the Adam kernel), params-all-gather (the distributed optimizer's gather of the updated
//      shards; with --overlap-param-gather the wait before the next step's forward: the exposed part);
//   2  batch-generator (building a microbatch's tokens / labels / mask on the host), forward-compute and
//      backward-compute (each microbatch's forward / backward on a chunk), and the P2P names of the schedule's batched
//      calls (forward-recv, forward-send, backward-recv, backward-send, forward-send-backward-recv,
//      backward-send-forward-recv, forward-send-forward-recv, backward-send-backward-recv,
//      forward-backward-send-forward-backward-recv: Megatron's p2p_communication names; the time includes waiting
//      for the peer). The level-2 times come from the schedule runner's per-action timings (schedule_runner.h).
// Level 0 (the default, Megatron's): no timer runs; the step time and the log line's elapsed time are measured
// always.
// Clocks: on CPU ranks the host's steady clock (the work runs in the calls). On the CUDA backend the host only
// enqueues, so a timer is two marks on the compute stream (core/device_clock.h) — the device time between them,
// read at take() (the log interval), when the marks have long completed: no timer synchronizes the device. Nothing
// is marked while the stream is being captured into a CUDA graph: under --enable-cuda-graph the timers inside the
// captured region (all-grads-sync, the level-2 ones) stay empty and forward-backward times the replay.
// take(): per timer the sum over the window's intervals in milliseconds (0: not measured), then reset; Megatron's
// log divides by the iterations (normalizer = log_interval).
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "mcpp/pipeline_parallel/schedule_runner.h"

namespace mcpp {

class DeviceClock;

enum class TimerId : int {
  ForwardBackward,
  AllGradsSync,
  LayernormGradsAllReduce,
  EmbeddingGradsAllReduce,
  ParamsAllGather,
  OptimizerClipMainGrad,
  OptimizerInnerStep,
  Optimizer,
  BatchGenerator,
  ForwardCompute,
  BackwardCompute,
  ForwardRecv,
  ForwardSend,
  BackwardRecv,
  BackwardSend,
  ForwardSendForwardRecv,
  ForwardSendBackwardRecv,
  BackwardSendForwardRecv,
  BackwardSendBackwardRecv,
  ForwardBackwardSendForwardBackwardRecv,
  kCount
};
constexpr int kNumTimers = static_cast<int>(TimerId::kCount);

std::string_view timer_name(TimerId id);  // Megatron's name, e.g. "forward-backward"
int timer_level(TimerId id);              // 1 or 2
// The timer of a schedule action: forward-compute / backward-compute / the P2P name of a Comm's op set.
TimerId timer_of(const pipeline_parallel::Action& a);

class Timers {
 public:
  // log_level 0..2; device: time on the CUDA compute stream (a DeviceClock) instead of the host clock.
  Timers(int log_level, bool device);
  ~Timers();
  Timers(const Timers&) = delete;
  Timers& operator=(const Timers&) = delete;

  int log_level() const { return level_; }
  bool on(TimerId id) const { return timer_level(id) <= level_; }
  // The clock the schedule runner marks with for the level-2 timers (nullptr: host timing).
  DeviceClock* device_clock() const { return clock_.get(); }

  // RAII interval of one timer (nothing when the timer's level is off, or inside a CUDA-graph capture).
  class Scope {
   public:
    Scope(Timers* t, TimerId id);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Timers* t_ = nullptr;
    TimerId id_{};
    std::chrono::steady_clock::time_point t0_{};
    int64_t mark_ = -1;
  };
  Scope scope(TimerId id) { return Scope(this, id); }
  // A host interval measured elsewhere (e.g. batch-generator's), in ms.
  void add_ms(TimerId id, double ms);
  // One training step's schedule actions (the runner's timings; device marks on `clock` when set): added to
  // forward-compute / backward-compute / the P2P timers. With a clock other than device_clock() (the timeline's,
  // whose marks it retires) the intervals are read now (waiting for the marks).
  void add_actions(const std::vector<pipeline_parallel::ActionTiming>& actions, size_t from, DeviceClock* clock);
  // The window's total milliseconds per timer (0 where nothing was measured); resets.
  std::array<double, kNumTimers> take();

 private:
  struct Pending {  // a device interval not read yet
    TimerId id;
    int64_t from, to;
  };
  int level_;
  std::unique_ptr<DeviceClock> clock_;
  std::array<double, kNumTimers> ms_{};
  std::vector<Pending> pending_;
};

}  // namespace mcpp
