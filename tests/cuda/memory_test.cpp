// The CUDA device-memory seam: caching allocator, copies both ways, zero fill; and the visible skip. The pool's
// statistics and the device / library versions the metrics and provenance report (core/device_memory.h).
#include "cuda/cuda_test_util.h"

namespace mcpp {
namespace {
using namespace cuda_test;

TEST(CudaMemory, RoundTripZeroAndReuse) {
  MCPP_REQUIRE_CUDA();
  Tensor a = rnd({1000, 37}, 1);
  Tensor d = a.to(Device::CUDA);
  EXPECT_EQ(d.device(), Device::CUDA);
  Tensor d2 = d.clone();  // device -> device
  Tensor back = d2.to(Device::CPU);
  EXPECT_EQ(std::memcmp(back.raw(), a.raw(), a.nbytes()), 0);
  d2.zero_();
  Tensor z = d2.to(Device::CPU);
  for (int64_t i = 0; i < z.numel(); ++i) ASSERT_EQ(z.data<float>()[i], 0.0f);
  // Freed blocks are cached: many alloc/free cycles of one size must not fail or grow without bound.
  for (int i = 0; i < 1000; ++i) Tensor t = Tensor::empty({1 << 20}, DType::F32, Device::CUDA);
  // A view at an element offset copies the right bytes.
  Tensor sl = d.flat_slice(37 * 10 + 3, {50}).to(Device::CPU);
  EXPECT_EQ(std::memcmp(sl.raw(), a.data<float>() + 37 * 10 + 3, 50 * sizeof(float)), 0);
}

TEST(CudaMemory, AllocationFailureIsANamedError) {
  MCPP_REQUIRE_CUDA();
  EXPECT_THROW(Tensor::empty({int64_t(1) << 50}, DType::F32, Device::CUDA), Error);  // 4 PiB
  Tensor ok = Tensor::zeros({16}, DType::F32, Device::CUDA);  // the backend still works afterwards
  EXPECT_EQ(ok.to(Device::CPU).data<float>()[15], 0.0f);
}

TEST(CudaMemory, PoolStatisticsAndVersions) {
  MCPP_REQUIRE_CUDA();
  const CudaMemoryStats before = cuda_memory_stats();
  Tensor t = Tensor::empty({int64_t(64) << 20}, DType::F32, Device::CUDA);  // 256 MiB live
  const CudaMemoryStats during = cuda_memory_stats();
  EXPECT_GE(during.allocated, before.allocated + (size_t(256) << 20));
  EXPECT_GE(during.reserved, during.allocated);  // the pool holds at least what is in use
  EXPECT_GE(during.peak, during.allocated);
  t = Tensor();
  EXPECT_LT(cuda_memory_stats().allocated, during.allocated);  // freed (kept in the pool: reserved stays)
  EXPECT_GE(cuda_memory_stats().peak, during.allocated);
  EXPECT_FALSE(cuda_device_name().empty());
  EXPECT_GE(cuda_runtime_version(), 12000);  // CUDA 12 or newer (13000 for 13.0)
  EXPECT_GE(cuda_driver_version(), cuda_runtime_version());
}

}  // namespace
}  // namespace mcpp
