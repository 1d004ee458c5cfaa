// CUDA flash attention fwd/bwd vs the CPU backend's flash attention (itself checked against float64
// naive attention in tests/kernels): causal and full, GQA, head dims 64 and 128, s not a tile multiple.
// fp32 tensors run the CUDA-core kernels, bf16 tensors the tensor-core kernels (attention_mma_*.cu: P and dS
// rounded to bf16 before their products, as FlashAttention-2; within the bf16 tolerance, see tol()).
#include <cstring>
#include <cmath>

#include "cuda/cuda_test_util.h"

namespace mcpp {
namespace {
using namespace cuda_test;

struct AttnCase {
  int64_t s, b, nq, ng, d;
  bool causal;
};

// bf16 calls take cuDNN's fused attention where it has an engine (deterministic: its deterministic backward
// graph) unless the caller turned cuDNN off (CudnnAttentionScope: the mcpp tensor-core kernels); every path
// must match the CPU within the bf16 tolerance.
// drop_p > 0: attention dropout with a fixed key (key: its offset may be relative to a device base).
void check_case(const AttnCase& c, DType dt, bool deterministic = false, float drop_p = 0.0f,
                PhiloxKey key = {.seed = 99, .offset = 5}, const PhiloxKey* cpu_key = nullptr) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " s=" << c.s << " b=" << c.b << " nq=" << c.nq
                                    << " ng=" << c.ng << " d=" << c.d << " causal=" << c.causal
                                    << " deterministic=" << deterministic << " cudnn=" << ops::cuda::cudnn_attention()
                                    << " dropout=" << drop_p);
  const Shape qs{c.s, c.b, c.nq, c.d}, ks{c.s, c.b, c.ng, c.d}, ls{c.b, c.nq, c.s};
  const ops::AttentionOptions opt{.softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.d)),
                                  .causal = c.causal,
                                  .deterministic = deterministic,
                                  .dropout_p = drop_p,
                                  .dropout_key = key};
  ops::AttentionOptions cpu_opt = opt;
  if (cpu_key) cpu_opt.dropout_key = *cpu_key;
  Tensor q = rnd(qs, 1, dt, -2, 2), k = rnd(ks, 2, dt, -2, 2), v = rnd(ks, 3, dt), dout = rnd(qs, 4, dt);
  Tensor o_ref = Tensor::empty(qs), lse_ref = Tensor::empty(ls);
  ops::cpu::flash_attention_fwd(o_ref, lse_ref, q, k, v, cpu_opt, {});
  Tensor qd = dev(q, dt), kd = dev(k, dt), vd = dev(v, dt);
  Tensor o = poisoned(qs, dt), lse = poisoned(ls, DType::F32);
  ops::flash_attention_fwd(o, lse, qd, kd, vd, opt);
  // fp32: __expf and another summation order, ~1e-6; bf16: the output rounding
  EXPECT_REL(host(o), o_ref, tol(dt, 2e-5));
  EXPECT_REL(host(lse), lse_ref, 1e-5);

  // backward from the CPU's o (rounded like the CUDA tensors) so both sides see the same inputs
  Tensor o_in = dt == DType::F32 ? o_ref : o_ref.to(dt).to(DType::F32);
  Tensor dq_ref = Tensor::empty(qs), dk_ref = Tensor::empty(ks), dv_ref = Tensor::empty(ks);
  ops::cpu::flash_attention_bwd(dq_ref, dk_ref, dv_ref, dout, q, k, v, o_in, lse_ref, cpu_opt, {});
  Tensor dq = poisoned(qs, dt), dk = poisoned(ks, dt), dv = poisoned(ks, dt);
  ops::flash_attention_bwd(dq, dk, dv, dev(dout, dt), qd, kd, vd, dev(o_in, dt), dev(lse_ref), opt);
  EXPECT_REL(host(dq), dq_ref, tol(dt, 5e-5));
  EXPECT_REL(host(dk), dk_ref, tol(dt, 5e-5));
  EXPECT_REL(host(dv), dv_ref, tol(dt, 5e-5));
}

TEST(CudaFlashAttention, MatchesCpuCausalFullGqaBothHeadDims) {
  MCPP_REQUIRE_CUDA();
  for (DType dt : float_dtypes()) {
    check_case({.s = 80, .b = 2, .nq = 4, .ng = 2, .d = 64, .causal = true}, dt);
    check_case({.s = 80, .b = 2, .nq = 4, .ng = 2, .d = 64, .causal = false}, dt);
    check_case({.s = 45, .b = 1, .nq = 6, .ng = 1, .d = 128, .causal = true}, dt);
    check_case({.s = 45, .b = 1, .nq = 2, .ng = 2, .d = 128, .causal = false}, dt);
  }
}

// GQA's backward on cuDNN — natively (dK / dV per query head summed per group by a reduction node in the
// graph), not the MHA graph on k/v repeated to nq heads: where cuDNN runs the forward it must run this
// backward too, matching the CPU (d 128 causal, d 64 full; deterministic graph too).
TEST(CudaFlashAttention, GqaBackwardRunsOnCudnnNatively) {
  MCPP_REQUIRE_CUDA();
  const auto c0 = ops::cuda_cudnn_attention_counts();
  check_case({.s = 200, .b = 2, .nq = 8, .ng = 2, .d = 128, .causal = true}, DType::BF16);
  const auto c1 = ops::cuda_cudnn_attention_counts();
  if (c1.fwd == c0.fwd) GTEST_SKIP() << "cuDNN's fused attention is not available here (the mcpp kernels ran)";
  EXPECT_EQ(c1.bwd_gqa - c0.bwd_gqa, 1);
  EXPECT_EQ(c1.bwd - c0.bwd, 1);
  EXPECT_EQ(c1.bwd_gqa_repeat - c0.bwd_gqa_repeat, 0) << "no engine for the native GQA backward graph";
  check_case({.s = 80, .b = 2, .nq = 4, .ng = 2, .d = 64, .causal = false}, DType::BF16);
  check_case({.s = 200, .b = 2, .nq = 8, .ng = 2, .d = 128, .causal = true}, DType::BF16, /*deterministic=*/true);
  const auto c2 = ops::cuda_cudnn_attention_counts();
  EXPECT_EQ(c2.bwd_gqa - c0.bwd_gqa, 3);
  EXPECT_EQ(c2.bwd_gqa_repeat - c0.bwd_gqa_repeat, 0);
}

// The cuDNN plan cache is a bounded LRU (--variable-seq-lengths builds one plan per length): with capacity
// 3, six new sequence lengths leave 3 plans cached; the most recently used survives, an evicted length
// is rebuilt on its next use and gives bit-identical outputs (the forward is deterministic); a bad
// capacity is a named error.
TEST(CudaFlashAttention, CudnnPlanCacheIsABoundedLru) {
  MCPP_REQUIRE_CUDA();
  const int64_t old = ops::set_cudnn_plan_cache_capacity(3);
  const ops::AttentionOptions opt{.softmax_scale = 0.125f, .causal = true};
  auto fwd = [&](int64_t s) {
    const Shape qs{s, 1, 2, 64}, ls{1, 2, s};
    Tensor q = dev(rnd(qs, 1), DType::BF16), k = dev(rnd(qs, 2), DType::BF16), v = dev(rnd(qs, 3), DType::BF16);
    Tensor o = Tensor::empty(qs, DType::BF16, Device::CUDA), lse = Tensor::empty(ls, DType::F32, Device::CUDA);
    ops::flash_attention_fwd(o, lse, q, k, v, opt);
    return host(o);
  };
  const auto c0 = ops::cuda_cudnn_attention_counts();
  const Tensor first = fwd(97);
  if (ops::cuda_cudnn_attention_counts().fwd == c0.fwd) {
    ops::set_cudnn_plan_cache_capacity(old);
    GTEST_SKIP() << "cuDNN's fused attention is not available here (the mcpp kernels ran)";
  }
  for (int64_t s : {98, 99, 100, 101, 102}) {
    fwd(s);
    EXPECT_LE(ops::cuda_cudnn_attention_counts().plans_cached, 3);
  }
  const auto c1 = ops::cuda_cudnn_attention_counts();
  EXPECT_EQ(c1.plans_built - c0.plans_built, 6);
  EXPECT_EQ(c1.plans_evicted - c0.plans_evicted, c0.plans_cached + 6 - 3);  // c0 already within the 3
  fwd(102);  // the most recently used: still cached
  EXPECT_EQ(ops::cuda_cudnn_attention_counts().plans_built, c1.plans_built);
  const Tensor again = fwd(97);  // evicted: rebuilt
  EXPECT_EQ(ops::cuda_cudnn_attention_counts().plans_built, c1.plans_built + 1);
  EXPECT_EQ(0, std::memcmp(first.raw(), again.raw(), first.nbytes())) << "rebuilt plan, different output";
  EXPECT_THROW(ops::set_cudnn_plan_cache_capacity(0), Error);
  EXPECT_EQ(ops::set_cudnn_plan_cache_capacity(old), 3);
}

TEST(CudaFlashAttention, LongerSequenceCausal) {
  MCPP_REQUIRE_CUDA();
  check_case({.s = 1031, .b = 1, .nq = 4, .ng = 2, .d = 128, .causal = true}, DType::BF16);
}

TEST(CudaFlashAttention, ScalesTo8K) {  // O(s) memory: an [s, s] fp32 buffer would be 256 MiB per head
  MCPP_REQUIRE_CUDA();
  check_case({.s = 8192, .b = 1, .nq = 2, .ng = 1, .d = 128, .causal = true}, DType::BF16);
}

// The tensor-core kernels tile 128 queries / 32-64 keys: s around and between tile sizes, and causal tiles
// where whole warps are masked. (Not s = 1: one key gives p = 1 and dq = dk = 0 exactly, and a relative
// error against a reference of pure rounding noise measures nothing.)
TEST(CudaFlashAttention, Bf16SequenceNotATileMultiple) {
  MCPP_REQUIRE_CUDA();
  check_case({.s = 2, .b = 2, .nq = 2, .ng = 1, .d = 64, .causal = true}, DType::BF16);
  check_case({.s = 129, .b = 1, .nq = 4, .ng = 4, .d = 64, .causal = true}, DType::BF16);
  check_case({.s = 200, .b = 2, .nq = 6, .ng = 2, .d = 128, .causal = true}, DType::BF16);
  check_case({.s = 63, .b = 3, .nq = 8, .ng = 2, .d = 128, .causal = false}, DType::BF16);
  check_case({.s = 257, .b = 1, .nq = 3, .ng = 1, .d = 64, .causal = false}, DType::BF16);
}

// b * nq beyond the 65535 limit of a grid's y dimension (the heads are the x dimension on the bf16 path).
TEST(CudaFlashAttention, Bf16ManyHeads) {
  MCPP_REQUIRE_CUDA();
  check_case({.s = 5, .b = 2, .nq = 33000, .ng = 11000, .d = 64, .causal = true}, DType::BF16);
}

// Every block owns its outputs (no atomics): two backward runs are bit-identical.
// The same cases on every bf16 path: cuDNN (default and deterministic backward) and the mcpp kernels.
TEST(CudaFlashAttention, Bf16CudnnDeterministicAndMcppKernelsMatchCpu) {
  MCPP_REQUIRE_CUDA();
  for (bool cudnn : {true, false}) {
    const CudnnAttentionScope scope(cudnn);
    for (bool deterministic : {true, false}) {
      if (!cudnn && !deterministic) continue;  // the mcpp kernels do not depend on the flag
      check_case({.s = 1024, .b = 2, .nq = 4, .ng = 4, .d = 64, .causal = true}, DType::BF16, deterministic);
      check_case({.s = 333, .b = 2, .nq = 4, .ng = 2, .d = 128, .causal = true}, DType::BF16, deterministic);
      check_case({.s = 200, .b = 1, .nq = 2, .ng = 2, .d = 64, .causal = false}, DType::BF16, deterministic);
    }
  }
}

// AttentionOptions::deterministic (--deterministic-mode): the backward repeats bit for bit, on cuDNN's
// deterministic graph (which must be the one that ran where cuDNN has an engine) and on the mcpp kernels.
// Shapes large enough for many CTAs per (batch, head) — where the default graph's dQ atomics reorder.
TEST(CudaFlashAttention, Bf16BackwardIsDeterministic) {
  MCPP_REQUIRE_CUDA();
  struct Shape5 {
    int64_t s, b, nq, ng, d;
  };
  for (bool cudnn : {true, false}) {
    const CudnnAttentionScope scope(cudnn);
    for (const Shape5& c : {Shape5{300, 2, 4, 2, 64}, Shape5{1024, 4, 8, 8, 64}, Shape5{2048, 2, 4, 4, 128}}) {
      SCOPED_TRACE(::testing::Message() << "cudnn=" << cudnn << " s=" << c.s << " b=" << c.b << " nq=" << c.nq
                                        << " ng=" << c.ng << " d=" << c.d);
      const ops::AttentionOptions opt{.softmax_scale = 0.125f, .causal = true, .deterministic = true};
      const DType bf = DType::BF16;
      Tensor q = dev(rnd({c.s, c.b, c.nq, c.d}, 11, bf), bf), k = dev(rnd({c.s, c.b, c.ng, c.d}, 12, bf), bf);
      Tensor v = dev(rnd({c.s, c.b, c.ng, c.d}, 13, bf), bf), dout = dev(rnd({c.s, c.b, c.nq, c.d}, 14, bf), bf);
      Tensor o = poisoned({c.s, c.b, c.nq, c.d}, bf), lse = poisoned({c.b, c.nq, c.s}, DType::F32);
      ops::flash_attention_fwd(o, lse, q, k, v, opt);
      const auto before = ops::cuda_cudnn_attention_counts();
      Tensor first[3], again[3];
      for (int rep = 0; rep < 4; ++rep) {
        Tensor* out = rep == 0 ? first : again;
        for (int i = 0; i < 3; ++i) out[i] = poisoned(i == 0 ? q.shape() : k.shape(), bf);
        ops::flash_attention_bwd(out[0], out[1], out[2], dout, q, k, v, o, lse, opt);
        if (rep == 0) continue;
        for (int i = 0; i < 3; ++i) {
          Tensor x = first[i].to(Device::CPU), y = again[i].to(Device::CPU);
          EXPECT_EQ(std::memcmp(x.raw(), y.raw(), x.nbytes()), 0) << "grad " << i << ", repetition " << rep;
        }
      }
      const auto after = ops::cuda_cudnn_attention_counts();
      if (!cudnn) {
        EXPECT_EQ(after.bwd, before.bwd) << "cuDNN switched off, yet a cuDNN backward ran";
      } else if (after.fwd > 0) {
        EXPECT_EQ(after.bwd - before.bwd, 4) << "cuDNN runs the forward but not this backward";
      }
    }
  }
}

// Attention dropout: the mcpp kernels draw the CPU's mask in-tile (philox.cuh), so CUDA matches the CPU
// op within the usual tolerance — fp32 on the CUDA-core kernels, bf16 on the tensor-core kernels, which
// take the call even with cuDNN on (cuDNN's fused attention draws other numbers and must not run).
// p = 0.5 on s around the tiles; a mask at other indices or ignored in one pass is off by O(1).
TEST(CudaFlashAttention, DropoutMatchesCpuOnTheMcppKernels) {
  MCPP_REQUIRE_CUDA();
  const auto c0 = ops::cuda_cudnn_attention_counts();
  for (DType dt : float_dtypes())
    for (float p : {0.1f, 0.5f}) {
      check_case({.s = 80, .b = 2, .nq = 4, .ng = 2, .d = 64, .causal = true}, dt, false, p);
      check_case({.s = 45, .b = 1, .nq = 2, .ng = 2, .d = 128, .causal = false}, dt, false, p);
    }
  for (bool deterministic : {false, true}) {
    check_case({.s = 333, .b = 2, .nq = 8, .ng = 2, .d = 128, .causal = true}, DType::BF16, deterministic, 0.1f);
    check_case({.s = 257, .b = 1, .nq = 3, .ng = 1, .d = 64, .causal = false}, DType::BF16, deterministic, 0.3f);
  }
  const auto c1 = ops::cuda_cudnn_attention_counts();
  EXPECT_EQ(c1.fwd, c0.fwd) << "cuDNN ran a forward with attention dropout";
  EXPECT_EQ(c1.bwd, c0.bwd) << "cuDNN ran a backward with attention dropout";
}

// A CUDA-graph key (offset relative to a device base, core/rng.h) draws the mask of the absolute offset.
TEST(CudaFlashAttention, DropoutDeviceBaseKeyEqualsTheAbsoluteOffset) {
  MCPP_REQUIRE_CUDA();
  Tensor base = Tensor::empty({1}, DType::I64);
  for (int64_t b : {int64_t{0}, int64_t{7}, int64_t{1} << 40}) {
    SCOPED_TRACE(b);
    base.data<int64_t>()[0] = b;
    Tensor base_d = base.to(Device::CUDA);
    const PhiloxKey rel{.seed = 99, .offset = 3, .device_base = static_cast<const uint64_t*>(base_d.raw())};
    const PhiloxKey abs{.seed = 99, .offset = 3 + static_cast<uint64_t>(b)};
    for (DType dt : float_dtypes())
      check_case({.s = 70, .b = 1, .nq = 2, .ng = 1, .d = 64, .causal = true}, dt, false, 0.4f, rel, &abs);
  }
}

TEST(CudaFlashAttention, DropoutRejectsBadProbability) {
  MCPP_REQUIRE_CUDA();
  Tensor q = Tensor::zeros({4, 1, 2, 64}, DType::BF16, Device::CUDA);
  Tensor lse = Tensor::zeros({1, 2, 4}, DType::F32, Device::CUDA), o = Tensor::zeros(q.shape(), DType::BF16, Device::CUDA);
  EXPECT_THROW(ops::flash_attention_fwd(o, lse, q, q, q, {.dropout_p = 1.0f}), Error);
  EXPECT_THROW(ops::flash_attention_fwd(o, lse, q, q, q, {.dropout_p = -0.5f}), Error);
}

TEST(CudaFlashAttention, RejectsUnsupportedHeadDim) {
  MCPP_REQUIRE_CUDA();
  Tensor q = Tensor::zeros({4, 1, 2, 32}, DType::F32, Device::CUDA), lse = Tensor::zeros({1, 2, 4}, DType::F32, Device::CUDA);
  Tensor o = Tensor::zeros({4, 1, 2, 32}, DType::F32, Device::CUDA);
  EXPECT_THROW(ops::flash_attention_fwd(o, lse, q, q, q, {}), Error);
}

}  // namespace
}  // namespace mcpp
