// Stream: the execution queue an op runs on. CPU ops run synchronously and ignore it; the CUDA backend
// reads `handle` as a cudaStream_t (nullptr = the backend's default compute stream).
#pragma once

namespace mcpp {
struct Stream {
  void* handle = nullptr;
};
}  // namespace mcpp
