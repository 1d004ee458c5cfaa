// DeviceClock on CUDA events (contract: core/device_clock.h). Events are created with timing enabled
// (the default flags), reused after retire_before (a pool) and destroyed with the clock. The live marks
// are a deque whose front has id `first`.
#include "mcpp/core/device_clock.h"

#include <cuda_runtime.h>

#include <deque>
#include <vector>

#include "mcpp/core/cuda_graph.h"
#include "mcpp/core/device_memory.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/cuda/cuda_check.h"

namespace mcpp {

struct DeviceClock::Impl {
  std::deque<cudaEvent_t> live;  // marks [first, first + live.size())
  int64_t first = 0;
  std::vector<cudaEvent_t> pool;  // retired, recorded again by later marks
  cudaEvent_t at(int64_t id, int64_t made) const {
    MCPP_CHECK(id >= first && id < made, "DeviceClock: mark {} is {} ({} marks made, {} retired)", id,
               id < first && id >= 0 ? "retired" : "unknown", made, first);
    return live[static_cast<size_t>(id - first)];
  }
};

DeviceClock::DeviceClock() : impl_(std::make_unique<Impl>()) {
  if (!cuda_available()) fail("DeviceClock: device timing needs a CUDA device (none available)");
}

DeviceClock::~DeviceClock() {
  // Never throws; a pending event is fine to destroy.
  for (cudaEvent_t e : impl_->live) cudaEventDestroy(e);
  for (cudaEvent_t e : impl_->pool) cudaEventDestroy(e);
}

int64_t DeviceClock::mark(Stream stream) {
  const cudaStream_t s = stream.handle ? static_cast<cudaStream_t>(stream.handle) : cuda_detail::compute_stream();
  if (cuda_detail::is_capturing(s))
    fail("DeviceClock::mark: the {} stream is being captured into a CUDA graph (a captured event has no time); "
         "--timeline and --enable-cuda-graph do not combine", stream.handle ? "marked" : "compute");
  cudaEvent_t e = nullptr;
  if (impl_->pool.empty()) {
    MCPP_CUDA_CHECK(cudaEventCreate(&e));
  } else {
    e = impl_->pool.back();
    impl_->pool.pop_back();
  }
  impl_->live.push_back(e);
  MCPP_CUDA_CHECK(cudaEventRecord(e, s));
  return size() - 1;
}

double DeviceClock::micros_between(int64_t from, int64_t to) const {
  const int64_t n = size();
  cudaEvent_t a = impl_->at(from, n), b = impl_->at(to, n);
  MCPP_CUDA_CHECK(cudaEventSynchronize(b));
  MCPP_CUDA_CHECK(cudaEventSynchronize(a));
  float ms = 0.0f;
  MCPP_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  return 1000.0 * static_cast<double>(ms);
}

int64_t DeviceClock::size() const { return impl_->first + live(); }

int64_t DeviceClock::live() const { return static_cast<int64_t>(impl_->live.size()); }

void DeviceClock::retire_before(int64_t id) {
  MCPP_CHECK(id <= size(), "DeviceClock::retire_before({}): only {} marks made", id, size());
  for (; impl_->first < id; ++impl_->first) {
    impl_->pool.push_back(impl_->live.front());
    impl_->live.pop_front();
  }
}

}  // namespace mcpp
