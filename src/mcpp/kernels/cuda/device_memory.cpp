// CUDA side of the device-memory seam (core/device_memory.h) and the backend's shared host helpers.
//
// Allocator: a caching, stream-ordered allocator built on the device's default CUDA memory pool
// (cudaMallocAsync / cudaFreeAsync on compute_stream()). The pool's release threshold is raised to
// "never", so freed blocks stay cached in the pool and are reused by later allocations without a
// cudaMalloc or a device synchronization; blocks freed on the compute stream are reusable by work
// ordered after the free on that stream. Work on other streams that touches a tensor must be ordered
// against compute_stream() (events) before the tensor is freed — the usual stream-ordered contract.
// Copies: host<->device copies are synchronous for the caller (async on compute_stream, then a stream
// sync), so Tensor::to / copy_from can read the result at once; device->device copies are async on
// compute_stream(). memset_zero is async on compute_stream().
// available(): compiled with CUDA and at least one device visible (probed once, errors mean "no").
// CUDA-graph capture (core/cuda_graph.h): while the compute stream is captured, alloc() records each
// allocation (a graph allocation node) and free() frees only those inside the graph; a pointer allocated
// before the capture and freed during it is held (returned to the CudaGraph, freed when it is destroyed).
// Host-side copies refuse to run during a capture. peak_bytes() adds the graph memory pool's high mark.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "mcpp/core/cuda_graph.h"
#include "mcpp/core/device_memory.h"
#include "mcpp/kernels/cuda/cuda_check.h"

namespace mcpp {
namespace cuda_detail {

void throw_cuda_error(const char* what, const char* name, const char* text, const char* file, int line) {
  int dev = -1;
  cudaGetDevice(&dev);
  throw Error(fmt::format("CUDA error in `{}`: {}: {} ({}:{}, device {})", what, name, text, file, line, dev));
}

void check_launch(const char* file, int line) { check_cuda(cudaGetLastError(), "kernel launch", file, line); }
void check_runtime(cudaError_t e, const char* expr, const char* file, int line) { check_cuda(e, expr, file, line); }

void check_cublas(cublasStatus_t s, const char* expr, const char* file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  int dev = -1;
  cudaGetDevice(&dev);
  throw Error(fmt::format("cuBLAS error in `{}`: status {} ({}:{}, device {})", expr, static_cast<int>(s), file, line,
                          dev));
}

cudaStream_t compute_stream() {
  static cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    MCPP_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaMemPool_t pool = nullptr;
    int dev = 0;
    MCPP_CUDA_CHECK(cudaGetDevice(&dev));
    MCPP_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
    uint64_t keep = UINT64_MAX;  // cache freed blocks; never trim at synchronization points
    MCPP_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    return s;
  }();
  return stream;
}

int64_t linear_bwd_rows(const char* op, const Tensor& dw_acc, const Tensor& dy, const Tensor& x, const Tensor& w) {
  MCPP_CHECK(w.ndim() == 2 && dw_acc.shape() == w.shape(), "{}: w [out, in] and dw_acc like w; got w {}, dw_acc {}",
             op, w.str(), dw_acc.str());
  require_float(op, "dw_acc", dw_acc, /*bf16_ok=*/false);
  const int64_t out = w.size(0), in = w.size(1), n = x.numel() / std::max<int64_t>(in, 1);
  MCPP_CHECK(dy.numel() == n * out && x.numel() == n * in, "{}: dy [n, {}] and x [n, {}]; got dy {}, x {}", op, out,
             in, dy.str(), x.str());
  return n;
}

Kind require_float(const char* op, const char* arg, const Tensor& t, bool bf16_ok) {
  MCPP_CHECK(t.defined(), "{}: {} is an undefined tensor", op, arg);
  MCPP_CHECK(t.device() == Device::CUDA, "{}: {} must be a CUDA tensor; got {}", op, arg, t.str());
  if (t.dtype() == DType::F32) return kF32;
  MCPP_CHECK(bf16_ok && (t.dtype() == DType::BF16 || t.dtype() == DType::F16), "{}: {} must be {}; got {}", op, arg,
             bf16_ok ? "float32, bfloat16 or float16" : "float32", t.str());
  return t.dtype() == DType::BF16 ? kBF16 : kF16;
}

void require_i32(const char* op, const char* arg, const Tensor& t) {
  MCPP_CHECK(t.defined() && t.device() == Device::CUDA && t.dtype() == DType::I32,
             "{}: {} must be a CUDA int32 tensor; got {}", op, arg, t.defined() ? t.str() : "undefined");
}

void require_numel(const char* op, const char* arg, const Tensor& t, int64_t numel, const char* why) {
  MCPP_CHECK(t.numel() == numel, "{}: {} must have {} elements ({}); got {}", op, arg, numel, why, t.str());
}

void require_same_shape(const char* op, const char* arg, const Tensor& t, const char* ref_name, const Tensor& ref) {
  MCPP_CHECK(t.shape() == ref.shape(), "{}: {} must have the shape of {} {}; got {}", op, arg, ref_name,
             shape_str(ref.shape()), t.str());
}

float* row_stat(const char* op, const char* arg, const Tensor& t, int64_t n) {
  require_float(op, arg, t, /*bf16_ok=*/false);
  require_numel(op, arg, t, n, "one per row of x");
  return const_cast<float*>(t.data<float>());
}

int64_t last_dim(const char* op, const char* arg, const Tensor& t) {
  MCPP_CHECK(t.ndim() >= 1, "{}: {} must have at least one dimension; got {}", op, arg, t.str());
  return t.size(-1);
}

namespace {
struct CaptureTracking {
  std::mutex mu;
  bool active = false;
  std::unordered_map<void*, size_t> graph_allocs;  // allocated during the capture, not yet freed
  std::vector<void*> held;                         // allocated before, freed during the capture
  size_t peak_before = 0;                          // the pool's high mark before the first capture
};
CaptureTracking& tracking() {
  static CaptureTracking t;
  return t;
}
cudaMemPool_t default_pool() {
  cudaMemPool_t pool = nullptr;
  int dev = 0;
  MCPP_CUDA_CHECK(cudaGetDevice(&dev));
  MCPP_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
  return pool;
}
}  // namespace

void capture_tracking_begin() {
  compute_stream();  // the pool's settings first
  MCPP_CUDA_CHECK(cudaDeviceSynchronize());
  cudaMemPool_t pool = default_pool();
  uint64_t high = 0;
  MCPP_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high));
  CaptureTracking& t = tracking();
  std::lock_guard<std::mutex> lock(t.mu);
  t.peak_before = std::max(t.peak_before, static_cast<size_t>(high));
  // Cached free blocks go back to the device so the graph's own pool can map that memory; the pool's
  // high mark restarts at what is in use now (peak_bytes() keeps the earlier peak).
  MCPP_CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
  uint64_t zero = 0;
  MCPP_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
  t.active = true;
  t.graph_allocs.clear();
  t.held.clear();
}

CaptureEnd capture_tracking_end() {
  CaptureTracking& t = tracking();
  std::lock_guard<std::mutex> lock(t.mu);
  CaptureEnd e;
  for (const auto& [p, bytes] : t.graph_allocs) {
    ++e.live_allocations;
    e.live_bytes += bytes;
  }
  e.held = std::move(t.held);
  t.active = false;
  t.graph_allocs.clear();
  t.held.clear();
  return e;
}

}  // namespace cuda_detail

namespace cuda_backend {
using cuda_detail::compute_stream;

void* alloc(size_t nbytes) {
  void* p = nullptr;
  if (nbytes == 0) nbytes = 1;
  cuda_detail::CaptureTracking& t = cuda_detail::tracking();
  std::lock_guard<std::mutex> lock(t.mu);
  cudaError_t e = cudaMallocAsync(&p, nbytes, compute_stream());
  if (e == cudaSuccess && t.active) t.graph_allocs.emplace(p, nbytes);
  if (e != cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    cudaGetLastError();
    cudaMemGetInfo(&free_b, &total_b);
    fail("CUDA allocation of {} bytes failed: {} (device memory free {} of {} bytes)", nbytes, cudaGetErrorString(e),
         free_b, total_b);
  }
  return p;
}

void free(void* ptr) {
  if (!ptr) return;
  cuda_detail::CaptureTracking& t = cuda_detail::tracking();
  std::lock_guard<std::mutex> lock(t.mu);
  if (t.active && t.graph_allocs.erase(ptr) == 0) {  // not the graph's: the graph may still use it
    t.held.push_back(ptr);
    return;
  }
  // Called from destructors: never throw. A failure here means the context is already broken and the
  // next checked call reports it.
  if (cudaFreeAsync(ptr, compute_stream()) != cudaSuccess) cudaGetLastError();
}

void memcpy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  if (nbytes == 0) return;
  cudaStream_t s = compute_stream();
  if (dst_device == Device::CUDA && src_device == Device::CUDA) {
    MCPP_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, s));
    return;
  }
  // A host side is involved: make the copy visible to the caller before returning. Device work on other
  // streams is not ordered here; a device->host read first waits for all device work.
  if (stream_capturing())
    fail("a {} copy of {} bytes during CUDA-graph capture: the captured step must not need the host (a "
         "device->host read or a host->device upload synchronizes); keep the value on the device",
         src_device == Device::CUDA ? "device->host" : "host->device", nbytes);
  if (src_device == Device::CUDA) MCPP_CUDA_CHECK(cudaDeviceSynchronize());
  const cudaMemcpyKind kind = dst_device == Device::CUDA ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  MCPP_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, kind, s));
  MCPP_CUDA_CHECK(cudaStreamSynchronize(s));
}

void memset_zero(void* dst, size_t nbytes) {
  if (nbytes) MCPP_CUDA_CHECK(cudaMemsetAsync(dst, 0, nbytes, compute_stream()));
}

bool available() {
  static const bool ok = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return n > 0;
  }();
  return ok;
}

void synchronize() { MCPP_CUDA_CHECK(cudaDeviceSynchronize()); }

size_t total_bytes() {
  size_t free = 0, total = 0;
  MCPP_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return total;
}

size_t peak_bytes() {
  // Before any capture: the pool's high mark. After one: max(the pool's high mark before it, the pool's
  // high mark since + the graph pool's) — an upper bound, the two need not peak at the same time.
  int dev = 0;
  MCPP_CUDA_CHECK(cudaGetDevice(&dev));
  uint64_t high = 0, graph_high = 0;
  uint64_t used = 0;  // the high mark reads 0 right after a reset until the next allocation
  MCPP_CUDA_CHECK(cudaMemPoolGetAttribute(cuda_detail::default_pool(), cudaMemPoolAttrUsedMemHigh, &high));
  MCPP_CUDA_CHECK(cudaMemPoolGetAttribute(cuda_detail::default_pool(), cudaMemPoolAttrUsedMemCurrent, &used));
  high = std::max(high, used);
  MCPP_CUDA_CHECK(cudaDeviceGetGraphMemAttribute(dev, cudaGraphMemAttrUsedMemHigh, &graph_high));
  cuda_detail::CaptureTracking& t = cuda_detail::tracking();
  std::lock_guard<std::mutex> lock(t.mu);
  return std::max(t.peak_before, static_cast<size_t>(high + graph_high));
}

size_t allocated_bytes() {
  uint64_t used = 0;
  MCPP_CUDA_CHECK(cudaMemPoolGetAttribute(cuda_detail::default_pool(), cudaMemPoolAttrUsedMemCurrent, &used));
  return used;
}

size_t reserved_bytes() {
  int dev = 0;
  MCPP_CUDA_CHECK(cudaGetDevice(&dev));
  uint64_t reserved = 0, graph_reserved = 0;
  MCPP_CUDA_CHECK(cudaMemPoolGetAttribute(cuda_detail::default_pool(), cudaMemPoolAttrReservedMemCurrent, &reserved));
  MCPP_CUDA_CHECK(cudaDeviceGetGraphMemAttribute(dev, cudaGraphMemAttrReservedMemCurrent, &graph_reserved));
  return reserved + graph_reserved;
}

std::string device_name() {
  int dev = 0;
  MCPP_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  MCPP_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  return prop.name;
}

int runtime_version() {
  int v = 0;
  return cudaRuntimeGetVersion(&v) == cudaSuccess ? v : 0;
}

int driver_version() {
  int v = 0;
  return cudaDriverGetVersion(&v) == cudaSuccess ? v : 0;
}

}  // namespace cuda_backend
}  // namespace mcpp
