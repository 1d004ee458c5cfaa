// Raw memory on a device: the one seam between core/ and a GPU backend.
// CPU: aligned host allocation. CUDA: the backend's caching allocator (kernels/cuda), or, in a build
// without CUDA, the stub that throws "built without CUDA".
#pragma once
#include <cstddef>
#include <string>

#include "mcpp/core/dtype.h"

namespace mcpp {

void* device_alloc(size_t nbytes, Device device);
void device_free(void* ptr, Device device);
void device_memcpy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);
void device_memset_zero(void* dst, Device device, size_t nbytes);
bool cuda_available();  // compiled with CUDA and a device is visible
// High-water mark of device memory in use through the CUDA allocator since the process started
// (the memory pool's used-memory high mark; torch.cuda.max_memory_allocated's analogue). 0 without CUDA.
size_t cuda_peak_memory_bytes();
size_t cuda_total_memory_bytes();  // the current device's memory (cudaMemGetInfo's total); 0 without CUDA
void cuda_synchronize();  // waits for all work on the device (no-op without CUDA)
// The host's memory: physical RAM, or the cgroup (v2 memory.max / v1 limit_in_bytes) limit when smaller.
size_t host_memory_bytes();
// The memory pool now (torch.cuda.memory_allocated / memory_reserved's analogues) and the peak above; zeros without
// CUDA. Host reads of pool attributes: no synchronization.
struct CudaMemoryStats {
  size_t allocated = 0, reserved = 0, peak = 0;
};
CudaMemoryStats cuda_memory_stats();
// The current device's name (cudaDeviceProp::name, e.g. "NVIDIA H100 80GB HBM3"), the CUDA runtime and driver
// versions (e.g. 13000); "" / 0 without CUDA.
std::string cuda_device_name();
int cuda_runtime_version();
int cuda_driver_version();
int cudnn_version();  // cudnnGetVersion() of the loaded cuDNN (e.g. 91002); 0 in a build without cuDNN

namespace cuda_backend {  // implemented in kernels/cuda or kernels/cuda_stub
void* alloc(size_t nbytes);
void free(void* ptr);
void memcpy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);
void memset_zero(void* dst, size_t nbytes);
bool available();
size_t peak_bytes();
size_t total_bytes();
void synchronize();
size_t allocated_bytes();  // the pool's used memory now
size_t reserved_bytes();   // the pool's reserved memory now (+ the graph pool's)
std::string device_name();
int runtime_version();
int driver_version();
}  // namespace cuda_backend

}  // namespace mcpp
