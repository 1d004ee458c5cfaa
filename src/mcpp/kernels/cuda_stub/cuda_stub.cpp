// Linked in a build without CUDA: every CUDA op and the device-memory seam report it clearly.
#include "mcpp/core/cuda_graph.h"
#include "mcpp/core/device_clock.h"
#include "mcpp/core/device_memory.h"
#include "mcpp/core/error.h"
#include "mcpp/core/trace_range.h"
#include "mcpp/kernels/deterministic_kernels.h"
#include "mcpp/kernels/fp8_block_gemm_path.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {
namespace cuda_backend {
[[noreturn]] static void no_cuda() { fail("this mcpp was built without CUDA (rebuild with nvcc available or -DMCPP_CUDA=ON)"); }
void* alloc(size_t) { no_cuda(); }
void free(void*) {}
void memcpy(void*, Device, const void*, Device, size_t) { no_cuda(); }
void memset_zero(void*, size_t) { no_cuda(); }
bool available() { return false; }
size_t peak_bytes() { return 0; }
size_t total_bytes() { return 0; }
void synchronize() {}
size_t allocated_bytes() { return 0; }
size_t reserved_bytes() { return 0; }
std::string device_name() { return {}; }
int runtime_version() { return 0; }
int driver_version() { return 0; }
}  // namespace cuda_backend

struct CudaGraph::Impl {};
CudaGraph::CudaGraph() = default;
CudaGraph::~CudaGraph() = default;
void CudaGraph::capture(const std::function<void()>&) {
  fail("CUDA graphs (--enable-cuda-graph) need the CUDA backend: this mcpp was built without CUDA");
}
void CudaGraph::replay() { fail("CudaGraph::replay: this mcpp was built without CUDA"); }
bool CudaGraph::captured() const { return false; }
int64_t CudaGraph::num_nodes() const { return 0; }
int64_t CudaGraph::replays() const { return 0; }
bool stream_capturing() { return false; }

struct DeviceClock::Impl {};
DeviceClock::DeviceClock() {
  fail("DeviceClock: device timing needs the CUDA backend: this mcpp was built without CUDA");
}
DeviceClock::~DeviceClock() = default;
int64_t DeviceClock::mark(Stream) { fail("DeviceClock::mark: this mcpp was built without CUDA"); }
double DeviceClock::micros_between(int64_t, int64_t) const { fail("DeviceClock: this mcpp was built without CUDA"); }
int64_t DeviceClock::size() const { return 0; }
void DeviceClock::retire_before(int64_t) { fail("DeviceClock: this mcpp was built without CUDA"); }
int64_t DeviceClock::live() const { return 0; }

namespace ops::cuda {
namespace {
bool g_deterministic = false;  // kept for the query; no CUDA op reads it in this build
}  // namespace
void set_deterministic_kernels(bool on) { g_deterministic = on; }
bool deterministic_kernels() { return g_deterministic; }
namespace {
bool g_cudnn_attention = true;  // kept for the query; no CUDA op reads it in this build
}  // namespace
void set_cudnn_attention(bool on) { g_cudnn_attention = on; }
bool cudnn_attention() { return g_cudnn_attention; }
namespace {
bool g_fp8_block_dequantize = false;  // kept for the query; no CUDA op reads it in this build
}  // namespace
Fp8BlockGemmCounts fp8_block_gemm_counts() { return {}; }  // no CUDA ops ever run
void set_fp8_block_gemm_dequantize(bool on) { g_fp8_block_dequantize = on; }
bool fp8_block_gemm_dequantize() { return g_fp8_block_dequantize; }
}  // namespace ops::cuda

void trace_range_push(const char*) {}  // no profiler ranges without CUDA
void trace_range_pop() {}

namespace ops {
EpilogueFusionCounts cuda_epilogue_fusion_counts() { return {}; }  // no CUDA ops ever run
GroupedGemmPathCounts cuda_grouped_gemm_path_counts() { return {}; }
CudnnAttentionCounts cuda_cudnn_attention_counts() { return {}; }
int64_t set_cudnn_plan_cache_capacity(int64_t capacity) {
  MCPP_CHECK(capacity >= 1, "set_cudnn_plan_cache_capacity: capacity must be >= 1, got {}", capacity);
  return 0;
}
}  // namespace ops

namespace ops::cuda {
#define MCPP_OP(ret, name, params) \
  ret name(MCPP_OP_UNPAREN params, Stream) { cuda_backend::alloc(0); fail("unreachable"); }
#include "mcpp/kernels/ops.inc"
#undef MCPP_OP
}  // namespace ops::cuda
}  // namespace mcpp

namespace mcpp {
int cudnn_version() { return 0; }  // core/device_memory.h: no cuDNN without CUDA
}  // namespace mcpp
