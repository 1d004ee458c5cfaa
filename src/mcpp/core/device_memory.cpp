#include "mcpp/core/device_memory.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>

#include "mcpp/core/error.h"

namespace mcpp {

void* device_alloc(size_t nbytes, Device device) {
  if (device == Device::CUDA) return cuda_backend::alloc(nbytes);
  size_t rounded = (nbytes + 63) / 64 * 64;
  void* p = rounded >= nbytes ? std::aligned_alloc(64, rounded) : nullptr;
  if (!p)
    fail("out of host memory: cannot allocate {} bytes ({:.2f} GiB) for a tensor (the host has {:.2f} GiB)", nbytes,
         static_cast<double>(nbytes) / (1 << 30), static_cast<double>(host_memory_bytes()) / (1 << 30));
  return p;
}

void device_free(void* ptr, Device device) {
  if (device == Device::CUDA) cuda_backend::free(ptr);
  else std::free(ptr);
}

void device_memcpy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  if (dst_device == Device::CPU && src_device == Device::CPU) std::memcpy(dst, src, nbytes);
  else cuda_backend::memcpy(dst, dst_device, src, src_device, nbytes);
}

void device_memset_zero(void* dst, Device device, size_t nbytes) {
  if (device == Device::CPU) std::memset(dst, 0, nbytes);
  else cuda_backend::memset_zero(dst, nbytes);
}

bool cuda_available() { return cuda_backend::available(); }
void cuda_synchronize() {
  if (cuda_available()) cuda_backend::synchronize();
}
size_t cuda_peak_memory_bytes() { return cuda_available() ? cuda_backend::peak_bytes() : 0; }
size_t cuda_total_memory_bytes() { return cuda_available() ? cuda_backend::total_bytes() : 0; }
CudaMemoryStats cuda_memory_stats() {
  if (!cuda_available()) return {};
  return {cuda_backend::allocated_bytes(), cuda_backend::reserved_bytes(), cuda_backend::peak_bytes()};
}
std::string cuda_device_name() { return cuda_available() ? cuda_backend::device_name() : std::string(); }
int cuda_runtime_version() { return cuda_backend::runtime_version(); }
int cuda_driver_version() { return cuda_available() ? cuda_backend::driver_version() : 0; }

size_t host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  size_t bytes = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : SIZE_MAX;
  for (const char* limit : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(limit);
    unsigned long long v = 0;
    if (in >> v && v > 0) bytes = std::min<size_t>(bytes, v);  // "max" (no limit) does not parse
  }
  return bytes;
}

}  // namespace mcpp
