// Per-op time profile of the kernel interface (MCPP_PROFILE_OPS=1 in the environment).
//
// When enabled, every op called through mcpp::ops (kernels/ops.cpp) is timed on the host between two
// device synchronizations (CUDA ops) — so each op's time is its own kernels' time, at the price of
// serializing the stream (the profile run is slower than a normal one; use it for the breakdown, not
// for throughput). At process exit the table of ops (backend, calls, total ms, share, mean us) goes to
// stderr, sorted by total time. Disabled (the default), an op pays one predictable branch. The same timer object
// reports each op to a module-trace recording (core/module_trace.h) when one is running.
#pragma once
#include <chrono>

#include "mcpp/core/module_trace.h"

namespace mcpp::ops {

bool op_profile_enabled();  // MCPP_PROFILE_OPS set and not "0", read once
// Forget what was recorded so far (the trainer calls it after the first, warm-up iteration: cuBLASLt
// plans, allocator growth and first-touch costs stay out of the table).
void op_profile_reset();

class OpTimer {
 public:
  OpTimer(const char* name, bool cuda) : name_(name), cuda_(cuda), on_(op_profile_enabled()) {
    if (on_) start();
    if (module_trace_recording()) module_trace_op(name);  // --trace-modules (core/module_trace.h)
  }
  ~OpTimer() {
    if (on_) stop();
  }
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  void start();
  void stop();
  const char* name_;
  bool cuda_;
  bool on_;
  std::chrono::steady_clock::time_point t0_{};
};

}  // namespace mcpp::ops
