// CudaGraph: CUDA-graph capture and replay of a region of work on the CUDA backend's compute stream —
// what Megatron's --enable-cuda-graph --cuda-graph-scope full_iteration does for forward_backward_func.
//
// Contract:
//   capture(fn)  runs fn with the compute stream in capture mode and instantiates the graph. The work fn
//                enqueues is RECORDED, not executed: call replay() to run it (also the first time). The
//                host code in fn runs once; every replay repeats only its device work, with the same
//                kernel arguments and the same device addresses.
//   replay()     launches the graph on the compute stream (asynchronous, stream-ordered).
//   Capture mode is thread-local: in fn, anything that needs the host — a device->host copy, a stream or
//   device synchronization, a host read of a device value — fails with an mcpp::Error naming it (see
//   stream_capturing()), the capture is abandoned, and the error propagates.
// Memory inside the captured region (kernels/cuda/device_memory.cpp):
//   - tensors allocated AND freed inside fn become the graph's allocation/free nodes (the graph's own
//     memory, reused on every replay);
//   - a tensor allocated inside fn that is still alive when fn returns is an error (it would dangle on
//     the next replay): capture() fails naming how many and their bytes;
//   - a tensor allocated before fn and freed inside it is kept alive until the graph is destroyed (the
//     graph may still read it on replays);
//   - everything else the region reads or writes must outlive the graph: parameters, gradient buffers,
//     and static input/output buffers the caller refills / reads between replays.
//   Before capturing, the backend's cached free memory is returned to the device so that the graph's
//   memory pool can use it; cuda_peak_memory_bytes() then counts the graph's memory too.
// Without CUDA (CPU build or no GPU), capture() throws.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>

namespace mcpp {

class CudaGraph {
 public:
  CudaGraph();
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  void capture(const std::function<void()>& fn);
  void replay();
  bool captured() const;
  int64_t num_nodes() const;  // kernels, copies, memsets, allocation and free nodes of the graph
  int64_t replays() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// True while this thread's CUDA compute stream is being captured (ops that need the host check it to
// fail with a clear message instead of a CUDA capture error). Always false without CUDA.
bool stream_capturing();

}  // namespace mcpp
