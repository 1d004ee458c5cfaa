// DeviceClock on CUDA events (contract: core/device_clock.h). Events are created with timing enabled
// (the default flags) and destroyed with the clock.
#include "mcpp/core/device_clock.h"

#include <cuda_runtime.h>

#include <vector>

#include "mcpp/core/cuda_graph.h"
#include "mcpp/core/device_memory.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/cuda/cuda_check.h"

namespace mcpp {

struct DeviceClock::Impl {
  std::vector<cudaEvent_t> events;
};

DeviceClock::DeviceClock() : impl_(std::make_unique<Impl>()) {
  if (!cuda_available()) fail("DeviceClock: device timing needs a CUDA device (none available)");
}

DeviceClock::~DeviceClock() {
  for (cudaEvent_t e : impl_->events) cudaEventDestroy(e);  // never throws; a pending event is fine to destroy
}

int64_t DeviceClock::mark() {
  if (stream_capturing())
    fail("DeviceClock::mark: the compute stream is being captured into a CUDA graph (a captured event has no "
         "time); --timeline and --enable-cuda-graph do not combine");
  cudaEvent_t e = nullptr;
  MCPP_CUDA_CHECK(cudaEventCreate(&e));
  impl_->events.push_back(e);
  MCPP_CUDA_CHECK(cudaEventRecord(e, cuda_detail::compute_stream()));
  return static_cast<int64_t>(impl_->events.size()) - 1;
}

double DeviceClock::micros_between(int64_t from, int64_t to) const {
  const int64_t n = size();
  MCPP_CHECK(from >= 0 && from < n && to >= 0 && to < n, "DeviceClock::micros_between({}, {}): {} marks made",
             from, to, n);
  cudaEvent_t a = impl_->events[static_cast<size_t>(from)], b = impl_->events[static_cast<size_t>(to)];
  MCPP_CUDA_CHECK(cudaEventSynchronize(b));
  MCPP_CUDA_CHECK(cudaEventSynchronize(a));
  float ms = 0.0f;
  MCPP_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  return 1000.0 * static_cast<double>(ms);
}

int64_t DeviceClock::size() const { return static_cast<int64_t>(impl_->events.size()); }

}  // namespace mcpp
