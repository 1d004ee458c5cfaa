// Helpers for the CUDA op tests: every CUDA op is compared with the CPU backend (ops::cpu::<op>, the
// reference) on the same random inputs. bf16 cases round the inputs to bf16 once on the host and give
// the CPU reference exactly those values (as fp32), so the measured error is the CUDA kernel's own
// (bf16 output rounding, fp32 accumulation order), not input quantization.
// MCPP_REQUIRE_CUDA() skips the test visibly ("no CUDA device") in CPU-only builds and GPU-less runs.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/grad_check.h"
#include "mcpp/core/device_memory.h"
#include "mcpp/core/error.h"
#include "mcpp/core/tensor.h"
#include "mcpp/kernels/deterministic_kernels.h"
#include "mcpp/kernels/gemm_autotune.h"
#include "mcpp/kernels/ops.h"

#define MCPP_REQUIRE_CUDA() \
  if (!::mcpp::cuda_available()) GTEST_SKIP() << "no CUDA device"

namespace mcpp::cuda_test {

// Sets ops::cuda::set_cudnn_attention for a scope (off: the bf16 attention ops run the mcpp kernels).
struct CudnnAttentionScope {
  explicit CudnnAttentionScope(bool on) : prev(ops::cuda::cudnn_attention()) { ops::cuda::set_cudnn_attention(on); }
  ~CudnnAttentionScope() { ops::cuda::set_cudnn_attention(prev); }
  CudnnAttentionScope(const CudnnAttentionScope&) = delete;
  CudnnAttentionScope& operator=(const CudnnAttentionScope&) = delete;
  bool prev;
};

// Restores the process-wide GEMM autotuning and deterministic-kernel settings at the end of a scope (a
// Trainer with --deterministic-mode changes both), also when an ASSERT leaves the test early.
struct KernelSettingsScope {
  KernelSettingsScope() : tune(ops::cuda::gemm_autotune()), det(ops::cuda::deterministic_kernels()) {}
  ~KernelSettingsScope() {
    ops::cuda::set_gemm_autotune(tune);
    ops::cuda::set_deterministic_kernels(det);
  }
  KernelSettingsScope(const KernelSettingsScope&) = delete;
  KernelSettingsScope& operator=(const KernelSettingsScope&) = delete;
  bool tune, det;
};

// CPU float32 tensor, uniform in [lo, hi), rounded to `dt` precision (bf16 / f16) when dt != F32.
inline Tensor rnd(const Shape& shape, uint64_t seed, DType dt = DType::F32, double lo = -1.0, double hi = 1.0) {
  Tensor t = mcpp::testing::random_tensor(shape, seed, nullptr, lo, hi);
  return dt == DType::F32 ? t : t.to(dt).to(DType::F32);
}

// CPU float32 -> CUDA tensor of dtype dt (values already representable when made by rnd(.., dt)).
inline Tensor dev(const Tensor& cpu_f32, DType dt = DType::F32) { return cpu_f32.to(dt).to(Device::CUDA); }

// CUDA tensor (any float dtype) -> CPU float32.
inline Tensor host(const Tensor& t) { return t.to(Device::CPU).to(DType::F32); }

// A CUDA output tensor filled with NaN-like garbage (0xFF bytes) so unwritten elements fail the compare.
inline Tensor poisoned(const Shape& shape, DType dt) {
  Tensor cpu = Tensor::empty(shape, dt);
  std::memset(cpu.raw(), 0xFF, cpu.nbytes());
  return cpu.to(Device::CUDA);
}

// ||got - want||_2 / ||want||_2 over float32 CPU tensors; NaN anywhere gives +inf (never passes).
inline double rel_err(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.numel(), want.numel());
  const float* g = got.data<float>();
  const float* w = want.data<float>();
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (!std::isfinite(g[i]) || !std::isfinite(w[i])) return INFINITY;
    num += (double(g[i]) - w[i]) * (double(g[i]) - w[i]);
    den += double(w[i]) * w[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// EXPECT_REL(got, want, tol): rel_err(got, want) < tol, and prints the measured error
// ("[ measured ] <expr>: <err> (tol <tol>)") so docs/CUDA.md can quote device numbers.
#define EXPECT_REL(got, want, tolerance)                                                              \
  do {                                                                                                \
    const double mcpp_err_ = ::mcpp::cuda_test::rel_err((got), (want));                              \
    const double mcpp_tol_ = (tolerance);                                                             \
    std::printf("[ measured ] %s: %.3g (tol %.3g)\n", #got, mcpp_err_, mcpp_tol_);                    \
    EXPECT_LT(mcpp_err_, mcpp_tol_) << #got;                                                          \
  } while (0)

// Relative error tolerance by dtype: fp32 outputs track the CPU to float rounding and summation order;
// bf16 outputs carry one bf16 rounding (2^-9 relative per element, ~2e-3 in norm) plus the rounding of
// any bf16 intermediate they are computed from.
inline double tol(DType dt, double f32_tol, double bf16_tol = 1e-2) { return dt == DType::F32 ? f32_tol : bf16_tol; }

inline std::vector<DType> float_dtypes() { return {DType::F32, DType::BF16}; }

}  // namespace mcpp::cuda_test
