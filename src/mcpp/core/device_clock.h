// DeviceClock: points in the CUDA backend's compute-stream order, read back as device time — what a
// pipeline timeline needs on GPUs, where the host returns from a kernel launch at once and host intervals
// measure the launches, not the work.
//
// Contract:
//   mark()                 enqueues a timing event on the compute stream and returns its id (0, 1, ...).
//                          The point is when the device reaches it: after all work queued before it.
//   micros_between(a, b)   device time in microseconds from mark a to mark b (waits until b has
//                          completed; cudaEventElapsedTime: ~0.5 us resolution, in float milliseconds, so
//                          distant marks lose precision (~1e-7 relative); negative if b came first). An
//                          unknown id is an mcpp::Error.
//   size()                 marks made so far.
// Not allowed while the compute stream is being captured into a CUDA graph (a captured event has no
// time): mark() then fails naming it. Without CUDA (CPU build or no GPU) the constructor throws.
#pragma once
#include <cstdint>
#include <memory>

namespace mcpp {

class DeviceClock {
 public:
  DeviceClock();
  ~DeviceClock();
  DeviceClock(const DeviceClock&) = delete;
  DeviceClock& operator=(const DeviceClock&) = delete;

  int64_t mark();
  double micros_between(int64_t from, int64_t to) const;
  int64_t size() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace mcpp
