// CudaGraph on the CUDA runtime (contract: core/cuda_graph.h).
// capture(): the allocator starts recording (device_memory.cpp: synchronize, return cached blocks to the
// device, track the capture's allocations), cudaStreamBeginCapture(compute stream, thread-local mode),
// fn(), cudaStreamEndCapture, then the checks (capture invalidated by an unsupported call, allocations
// that outlive the region) and cudaGraphInstantiate + cudaGraphUpload (the graph's memory is mapped once,
// not on the first replay). A failure ends the capture, drops the partial graph, clears the sticky
// "capture invalidated" error and rethrows with what the step must not do.
#include <cuda_runtime.h>

#include <fmt/format.h>

#include <vector>

#include "mcpp/core/cuda_graph.h"
#include "mcpp/core/device_memory.h"
#include "mcpp/kernels/cuda/cuda_check.h"

namespace mcpp {
using cuda_detail::compute_stream;

struct CudaGraph::Impl {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::vector<void*> held;  // eager allocations the captured work may still touch
  int64_t nodes = 0, replays = 0;
};

CudaGraph::CudaGraph() : impl_(std::make_unique<Impl>()) {}

CudaGraph::~CudaGraph() {
  // Never throws: a broken context is reported by the next checked call.
  if (impl_->exec || !impl_->held.empty()) cudaStreamSynchronize(compute_stream());
  if (impl_->exec) cudaGraphExecDestroy(impl_->exec);
  if (impl_->graph) cudaGraphDestroy(impl_->graph);
  for (void* p : impl_->held) cudaFreeAsync(p, compute_stream());
  cudaGetLastError();
}

void CudaGraph::capture(const std::function<void()>& fn) {
  MCPP_CHECK(!impl_->exec, "CudaGraph::capture: this graph is already captured");
  cudaStream_t s = compute_stream();
  cuda_detail::capture_tracking_begin();
  MCPP_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  std::string failure;
  try {
    fn();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  cuda_detail::CaptureEnd tracked = cuda_detail::capture_tracking_end();
  impl_->held = std::move(tracked.held);
  if (failure.empty() && end != cudaSuccess)
    failure = fmt::format("{}: {} (a call the capture does not support: a synchronization, a host read of a "
                          "device value, or work on a stream not joined to the capture)",
                          cudaGetErrorName(end), cudaGetErrorString(end));
  if (failure.empty() && tracked.live_allocations > 0)
    failure = fmt::format("{} tensors ({} bytes) allocated inside the captured region are still alive after it; "
                          "every tensor the region creates must be freed in it (outputs go to static buffers)",
                          tracked.live_allocations, tracked.live_bytes);
  if (!failure.empty()) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();  // the invalidated capture's sticky error
    fail("CUDA-graph capture failed: {}", failure);
  }
  impl_->graph = graph;
  MCPP_CUDA_CHECK(cudaGraphInstantiate(&impl_->exec, graph, 0));
  MCPP_CUDA_CHECK(cudaGraphUpload(impl_->exec, s));
  size_t n = 0;
  MCPP_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  impl_->nodes = static_cast<int64_t>(n);
}

void CudaGraph::replay() {
  MCPP_CHECK(impl_->exec, "CudaGraph::replay: nothing captured");
  MCPP_CUDA_CHECK(cudaGraphLaunch(impl_->exec, compute_stream()));
  ++impl_->replays;
}

bool CudaGraph::captured() const { return impl_->exec != nullptr; }
int64_t CudaGraph::num_nodes() const { return impl_->nodes; }
int64_t CudaGraph::replays() const { return impl_->replays; }

bool cuda_detail::is_capturing(cudaStream_t s) {  // an invalidated capture counts: still capturing
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  MCPP_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
  return st != cudaStreamCaptureStatusNone;
}

// A process without a GPU (the CPU trainer of a CUDA build) captures nothing, and must not create the stream.
bool stream_capturing() { return cuda_backend::available() && cuda_detail::is_capturing(compute_stream()); }

}  // namespace mcpp
