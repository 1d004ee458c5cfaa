// CUDA backend glue shared by kernels/cuda/*.{cu,cpp}: error CHECK macros that add the call site and the
// device, the backend's default compute stream, and the argument checks every CUDA op runs on the host.
//
// Contract:
//   MCPP_CUDA_CHECK(expr)    cudaError_t  != cudaSuccess        -> mcpp::Error "<expr>: <name>: <text> (file:line, device N)"
//   MCPP_CUBLAS_CHECK(expr)  cublasStatus_t != SUCCESS           -> mcpp::Error likewise
//   MCPP_CUDA_LAUNCH_CHECK() (launch.h) after every kernel launch: cudaGetLastError (launch errors; a fault
//                            inside a kernel surfaces at the next synchronizing call's CHECK)
//   stream_of(Stream)        the cudaStream_t an op runs on: Stream::handle, or compute_stream() when null.
//   compute_stream()         a non-blocking stream created on first use; device_memory orders
//                            allocation, free and copies on it (see device_memory.cpp).
// Host-only header (compiles under g++ and nvcc).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "mcpp/core/error.h"
#include "mcpp/core/stream.h"
#include "mcpp/core/tensor.h"
#include "mcpp/kernels/cuda/launch.h"

namespace mcpp::cuda_detail {

[[noreturn]] void throw_cuda_error(const char* what, const char* name, const char* text, const char* file, int line);

inline void check_cuda(cudaError_t e, const char* expr, const char* file, int line) {
  if (e != cudaSuccess) throw_cuda_error(expr, cudaGetErrorName(e), cudaGetErrorString(e), file, line);
}
void check_cublas(cublasStatus_t s, const char* expr, const char* file, int line);

cudaStream_t compute_stream();
// CUDA-graph capture bookkeeping of the allocator (device_memory.cpp; used by cuda_graph.cpp).
struct CaptureEnd {
  int64_t live_allocations = 0;  // allocated inside the capture and still alive at its end
  size_t live_bytes = 0;
  std::vector<void*> held;       // allocated before, freed during: the graph keeps them
};
void capture_tracking_begin();  // synchronizes, trims the pool, starts recording allocations
bool is_capturing(cudaStream_t s);  // s is being captured into a CUDA graph (cuda_graph.cpp)
CaptureEnd capture_tracking_end();
inline cudaStream_t stream_of(Stream s) {
  return s.handle ? static_cast<cudaStream_t>(s.handle) : compute_stream();
}

// A CUDA tensor of a floating dtype; bf16_ok = false restricts it to float32. Returns its Kind.
Kind require_float(const char* op, const char* arg, const Tensor& t, bool bf16_ok = true);
void require_i32(const char* op, const char* arg, const Tensor& t);
void require_numel(const char* op, const char* arg, const Tensor& t, int64_t numel, const char* why);
void require_same_shape(const char* op, const char* arg, const Tensor& t, const char* ref_name, const Tensor& ref);
int64_t last_dim(const char* op, const char* arg, const Tensor& t);
// A norm's row statistic (mean or rstd): float32, one per row of x (n). Returns its data.
float* row_stat(const char* op, const char* arg, const Tensor& t, int64_t n);
// A linear backward's operands (the FP8 ops): dw_acc float32 like w [out, in], dy [n, out], x [n, in]. Returns n.
int64_t linear_bwd_rows(const char* op, const Tensor& dw_acc, const Tensor& dy, const Tensor& x, const Tensor& w);

inline FIn fin(const Tensor& t, Kind k) { return FIn{t.raw(), k}; }
inline FOut fout(Tensor& t, Kind k) { return FOut{t.raw(), k}; }
inline FIn fin_of(const char* op, const char* arg, const Tensor& t) { return FIn{t.raw(), require_float(op, arg, t)}; }
inline FOut fout_of(const char* op, const char* arg, Tensor& t) { return FOut{t.raw(), require_float(op, arg, t)}; }

}  // namespace mcpp::cuda_detail

#define MCPP_CUDA_CHECK(expr) ::mcpp::cuda_detail::check_cuda((expr), #expr, __FILE__, __LINE__)
#define MCPP_CUBLAS_CHECK(expr) ::mcpp::cuda_detail::check_cublas((expr), #expr, __FILE__, __LINE__)
