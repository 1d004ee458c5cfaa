// DeviceClock: points in the CUDA backend's compute-stream order, read back as device time — what a
// pipeline timeline needs on GPUs, where the host returns from a kernel launch at once and host intervals
// measure the launches, not the work.
//
// Contract:
//   mark(stream = {})      enqueues a timing event on `stream` (default: the compute stream; another stream
//                          of the same device, e.g. NCCL's comm stream, measures what runs there) and returns
//                          its id (0, 1, ...). The point is when the device reaches it: after all work queued
//                          before it on that stream.
//   micros_between(a, b)   device time in microseconds from mark a to mark b (waits until b has
//                          completed; cudaEventElapsedTime: ~0.5 us resolution, in float milliseconds, so
//                          distant marks lose precision (~1e-7 relative); negative if b came first). An
//                          unknown id is an mcpp::Error.
//   size()                 marks made so far.
//   retire_before(id)      marks with ids < id will not be asked about again: their events go back to a pool
//                          the next marks reuse, so a long run keeps only the recent marks' events alive
//                          (the pipeline timeline retires each step once it has read its times). Asking
//                          about a retired id is an mcpp::Error; retiring is monotonic (a smaller id is a
//                          no-op), an id beyond size() is an error.
//   live()                 marks not retired (= the CUDA events held for them).
// Not allowed while the marked stream is being captured into a CUDA graph (a captured event has no
// time): mark() then fails naming it. Without CUDA (CPU build or no GPU) the constructor throws.
#pragma once
#include <cstdint>
#include <memory>

#include "mcpp/core/stream.h"

namespace mcpp {

class DeviceClock {
 public:
  DeviceClock();
  ~DeviceClock();
  DeviceClock(const DeviceClock&) = delete;
  DeviceClock& operator=(const DeviceClock&) = delete;

  int64_t mark(Stream stream = {});
  double micros_between(int64_t from, int64_t to) const;
  int64_t size() const;
  void retire_before(int64_t id);
  int64_t live() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace mcpp
