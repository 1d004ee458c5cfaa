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

// The inputs of a flash attention check and the CPU backend's results on them.
struct FlashAttentionCase {
  Tensor q, k, v, dout;              // [s, b, nq, d], [s, b, ng, d] x 2, [s, b, nq, d]: CPU float32 (dt values)
  Tensor o_ref, lse_ref;             // the CPU forward: [s, b, nq, d], [b, nq, s]
  Tensor o_in;                       // o_ref rounded like the CUDA tensors: the backward's o on both sides
  Tensor dq_ref, dk_ref, dv_ref;     // the CPU backward from o_in
};

// ops::flash_attention_fwd / _bwd (the split q, k, v form) on CUDA tensors of dtype dt against the CPU backend, on
// random q [s, b, nq, d] (seed 1, in [-2, 2)), k (seed 2, [-2, 2)), v (3), dout (4); opt: the CUDA call's options,
// cpu_opt: the CPU reference's (its dropout key or document mask on the host). The backward starts from the CPU's
// o rounded like the CUDA tensors, so both sides see the same inputs. Returns the inputs and the CPU's results (for
// other forms of the same call).
inline FlashAttentionCase check_flash_attention(const Shape& qs, const Shape& ks, DType dt,
                                                const ops::AttentionOptions& opt,
                                                const ops::AttentionOptions& cpu_opt) {
  FlashAttentionCase c;
  const Shape ls{qs[1], qs[2], qs[0]};  // [b, nq, s]
  c.q = rnd(qs, 1, dt, -2, 2), c.k = rnd(ks, 2, dt, -2, 2), c.v = rnd(ks, 3, dt), c.dout = rnd(qs, 4, dt);
  c.o_ref = Tensor::empty(qs), c.lse_ref = Tensor::empty(ls);
  ops::cpu::flash_attention_fwd(c.o_ref, c.lse_ref, c.q, c.k, c.v, cpu_opt, {});
  Tensor qd = dev(c.q, dt), kd = dev(c.k, dt), vd = dev(c.v, dt);
  Tensor o = poisoned(qs, dt), lse = poisoned(ls, DType::F32);
  ops::flash_attention_fwd(o, lse, qd, kd, vd, opt);
  // fp32: __expf and another summation order, ~1e-6; bf16: the output rounding
  EXPECT_REL(host(o), c.o_ref, tol(dt, 2e-5));
  EXPECT_REL(host(lse), c.lse_ref, 1e-5);
  c.o_in = dt == DType::F32 ? c.o_ref : c.o_ref.to(dt).to(DType::F32);
  c.dq_ref = Tensor::empty(qs), c.dk_ref = Tensor::empty(ks), c.dv_ref = Tensor::empty(ks);
  ops::cpu::flash_attention_bwd(c.dq_ref, c.dk_ref, c.dv_ref, c.dout, c.q, c.k, c.v, c.o_in, c.lse_ref, cpu_opt, {});
  Tensor dq = poisoned(qs, dt), dk = poisoned(ks, dt), dv = poisoned(ks, dt);
  ops::flash_attention_bwd(dq, dk, dv, dev(c.dout, dt), qd, kd, vd, dev(c.o_in, dt), dev(c.lse_ref), opt);
  EXPECT_REL(host(dq), c.dq_ref, tol(dt, 5e-5));
  EXPECT_REL(host(dk), c.dk_ref, tol(dt, 5e-5));
  EXPECT_REL(host(dv), c.dv_ref, tol(dt, 5e-5));
  return c;
}

}  // namespace mcpp::cuda_test
