// Named ranges for GPU profilers (NVTX): `TraceRange r("layer 3 fwd");` pushes a range that Nsight
// Systems shows on this thread's timeline until `r` goes out of scope. CUDA builds implement it with
// nvtx3 (header-only, in the CUDA toolkit; a few ns when no profiler is attached); CPU-only builds with
// a no-op (kernels/cuda_stub). The trainer marks steps, microbatch forward/backward per chunk, layers,
// gradient sync and the optimizer step.
#pragma once
#include <string>

namespace mcpp {

void trace_range_push(const char* name);  // kernels/cuda (nvtxRangePushA) or the stub
void trace_range_pop();

class TraceRange {
 public:
  explicit TraceRange(const char* name) { trace_range_push(name); }
  explicit TraceRange(const std::string& name) { trace_range_push(name.c_str()); }
  ~TraceRange() { trace_range_pop(); }
  TraceRange(const TraceRange&) = delete;
  TraceRange& operator=(const TraceRange&) = delete;
};

}  // namespace mcpp
