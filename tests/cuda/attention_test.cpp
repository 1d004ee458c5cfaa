// CUDA flash attention fwd/bwd vs the CPU backend's flash attention (itself checked against float64
// naive attention in tests/kernels): causal and full, GQA, every head dim (multiples of 8 up to 256), s not a
// tile multiple. fp32 tensors run the CUDA-core kernels, bf16 tensors cuDNN or the tensor-core kernels
// (attention_mma_*.cu, d 64 / 128: P and dS rounded to bf16 before their products, as FlashAttention-2; within
// the bf16 tolerance, see tol()), other bf16 head dims without cuDNN the CUDA-core kernels.
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
  const ops::AttentionOptions opt{.softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.d)),
                                  .causal = c.causal,
                                  .deterministic = deterministic,
                                  .dropout_p = drop_p,
                                  .dropout_key = key};
  ops::AttentionOptions cpu_opt = opt;
  if (cpu_key) cpu_opt.dropout_key = *cpu_key;
  check_flash_attention({c.s, c.b, c.nq, c.d}, {c.s, c.b, c.ng, c.d}, dt, opt, cpu_opt);
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

// Head dims other than 64 / 128 (multi-latent attention's 192 = 128 + 64; 96) in bf16 take cuDNN by default:
// forward and backward match the CPU (causal, GQA too) and cuDNN ran them.
TEST(CudaFlashAttention, CudnnOtherHeadDimsMatchCpu) {
  MCPP_REQUIRE_CUDA();
  const auto c0 = ops::cuda_cudnn_attention_counts();
  check_case({.s = 130, .b = 2, .nq = 4, .ng = 4, .d = 192, .causal = true}, DType::BF16);
  const auto c1 = ops::cuda_cudnn_attention_counts();
  if (c1.fwd == c0.fwd) GTEST_SKIP() << "cuDNN's fused attention is not available here";
  EXPECT_EQ(c1.bwd - c0.bwd, 1);
  check_case({.s = 77, .b = 1, .nq = 4, .ng = 2, .d = 96, .causal = true}, DType::BF16);
  check_case({.s = 64, .b = 2, .nq = 2, .ng = 2, .d = 192, .causal = true}, DType::BF16, /*deterministic=*/true);
}

// Every head dim (issue 35): d = 32, 80, 96, 256 (and 8, 40, 160, 200, 224 across the CUDA-core kernels' padded
// widths) in fp32 (CUDA-core kernels, the columns past d masked) and bf16 — by default (cuDNN where it has an
// engine) and with cuDNN off (the CUDA-core kernels on bf16 tensors: fp32 math, one rounding on store) — causal and
// full, MHA / GQA / MQA, s around the 16-query and 32-key tiles. Same tolerances as the 64 / 128 cases.
TEST(CudaFlashAttention, EveryHeadDimMatchesCpu) {
  MCPP_REQUIRE_CUDA();
  for (bool cudnn : {true, false}) {
    const CudnnAttentionScope scope(cudnn);
    for (DType dt : float_dtypes()) {
      if (cudnn && dt == DType::F32) continue;  // fp32 never takes cuDNN
      check_case({.s = 80, .b = 2, .nq = 4, .ng = 2, .d = 32, .causal = true}, dt);
      check_case({.s = 45, .b = 1, .nq = 4, .ng = 4, .d = 32, .causal = false}, dt);
      check_case({.s = 77, .b = 2, .nq = 6, .ng = 2, .d = 80, .causal = true}, dt);
      check_case({.s = 33, .b = 1, .nq = 2, .ng = 1, .d = 96, .causal = false}, dt);
      check_case({.s = 96, .b = 1, .nq = 4, .ng = 2, .d = 96, .causal = true}, dt);
      check_case({.s = 70, .b = 1, .nq = 2, .ng = 2, .d = 256, .causal = true}, dt);
      check_case({.s = 40, .b = 2, .nq = 4, .ng = 1, .d = 256, .causal = false}, dt);
    }
  }
  const CudnnAttentionScope mcpp_kernels(false);
  for (DType dt : float_dtypes())
    for (int64_t d : {8, 40, 160, 200, 224}) check_case({.s = 50, .b = 1, .nq = 2, .ng = 1, .d = d, .causal = true}, dt);
}

// Attention dropout at other head dims on the mcpp kernels (cuDNN off): the CPU's mask, bit for bit, so CUDA matches
// the CPU within the usual tolerance; deterministic mode too (the CUDA-core kernels are deterministic anyway).
TEST(CudaFlashAttention, EveryHeadDimDropoutMatchesCpu) {
  MCPP_REQUIRE_CUDA();
  const CudnnAttentionScope mcpp_kernels(false);
  for (DType dt : float_dtypes())
    for (bool deterministic : {false, true}) {
      check_case({.s = 80, .b = 2, .nq = 4, .ng = 2, .d = 32, .causal = true}, dt, deterministic, 0.3f);
      check_case({.s = 45, .b = 1, .nq = 2, .ng = 1, .d = 80, .causal = false}, dt, deterministic, 0.1f);
      check_case({.s = 66, .b = 1, .nq = 2, .ng = 2, .d = 256, .causal = true}, dt, deterministic, 0.5f);
    }
}

// The CUDA-core kernels at bf16 and another head dim are deterministic: the backward repeats bit for bit.
TEST(CudaFlashAttention, OtherHeadDimBackwardIsDeterministic) {
  MCPP_REQUIRE_CUDA();
  const CudnnAttentionScope mcpp_kernels(false);
  const DType bf = DType::BF16;
  const Shape qs{150, 2, 4, 96}, ks{150, 2, 2, 96}, ls{2, 4, 150};
  const ops::AttentionOptions opt{.softmax_scale = 0.1f, .causal = true};
  Tensor q = dev(rnd(qs, 1, bf, -2, 2), bf), k = dev(rnd(ks, 2, bf, -2, 2), bf), v = dev(rnd(ks, 3, bf), bf);
  Tensor dout = dev(rnd(qs, 4, bf), bf), o = poisoned(qs, bf), lse = poisoned(ls, DType::F32);
  ops::flash_attention_fwd(o, lse, q, k, v, opt);
  Tensor first[3];
  for (int rep = 0; rep < 3; ++rep) {
    Tensor dq = poisoned(qs, bf), dk = poisoned(ks, bf), dv = poisoned(ks, bf);
    ops::flash_attention_bwd(dq, dk, dv, dout, q, k, v, o, lse, opt);
    Tensor got[3] = {host(dq), host(dk), host(dv)};
    for (int i = 0; i < 3; ++i) {
      if (rep == 0) first[i] = got[i];
      else EXPECT_EQ(std::memcmp(got[i].raw(), first[i].raw(), got[i].nbytes()), 0) << "rep " << rep << " grad " << i;
    }
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

// Attention dropout on the mcpp kernels (cuDNN off: its RNG draws another mask): they draw the CPU's mask
// in-tile (philox.cuh), so CUDA matches the CPU op within the usual tolerance — fp32 on the CUDA-core
// kernels, bf16 on the tensor-core kernels. p = 0.5 on s around the tiles (s % 4 != 0 too: the per-pair
// draws); a mask at other indices or ignored in one pass is off by O(1).
TEST(CudaFlashAttention, DropoutMatchesCpuOnTheMcppKernels) {
  MCPP_REQUIRE_CUDA();
  const CudnnAttentionScope mcpp_kernels(false);
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
  check_case({.s = 130, .b = 1, .nq = 2, .ng = 1, .d = 64, .causal = true}, DType::BF16, false, 0.5f);
  const auto c1 = ops::cuda_cudnn_attention_counts();
  EXPECT_EQ(c1.fwd, c0.fwd) << "cuDNN switched off, yet it ran a forward";
  EXPECT_EQ(c1.bwd, c0.bwd) << "cuDNN switched off, yet it ran a backward";
}

// cuDNN's attention dropout (the bf16 default): its own Philox numbers, so the mask is recovered from the
// kernel itself — Q = K = 0 makes the causal softmax uniform, P_ij = 1 / (i + 1), and V = the identity
// (s = d = 128) makes O_ij = P_ij z_ij: z = 1 / (1 - p) or 0 read off O. Then, with that mask and the same
// key, random inputs against a float64 reference (forward and both backward graphs); the kept fraction is
// 1 - p within 7 standard deviations; the same key repeats the mask, another key changes it.
struct CudnnMask {
  std::vector<uint8_t> keep;  // [b, nq, s, s], causal part
  double kept_fraction = 0;
};

CudnnMask recover_cudnn_mask(int64_t b, int64_t nq, int64_t s, float p, const PhiloxKey& key) {
  const int64_t d = s;
  const DType bf = DType::BF16;
  Tensor zeros = Tensor::zeros({s, b, nq, d});
  Tensor eye = Tensor::zeros({s, b, nq, d});
  for (int64_t j = 0; j < s; ++j)
    for (int64_t x = 0; x < b * nq; ++x) eye.data<float>()[(j * b * nq + x) * d + j] = 1.0f;
  Tensor o = poisoned({s, b, nq, d}, bf), lse = poisoned({b, nq, s}, DType::F32);
  const ops::AttentionOptions opt{.softmax_scale = 0.1f, .causal = true, .dropout_p = p, .dropout_key = key};
  ops::flash_attention_fwd(o, lse, dev(zeros, bf), dev(zeros, bf), dev(eye, bf), opt);
  Tensor oh = host(o);
  CudnnMask m;
  m.keep.assign(static_cast<size_t>(b * nq * s * s), 0);
  int64_t kept = 0, total = 0;
  for (int64_t i = 0; i < s; ++i)
    for (int64_t x = 0; x < b * nq; ++x)
      for (int64_t j = 0; j <= i; ++j) {
        const float v = oh.data<float>()[(i * b * nq + x) * d + j];
        const bool k = v > 0.0f;
        // kept: 1 / ((1 - p)(i + 1)) up to bf16 rounding; dropped: exactly 0
        if (k) {
          EXPECT_NEAR(v * (1.0f - p) * static_cast<float>(i + 1), 1.0f, 1e-2) << i << " " << j;
        }
        m.keep[static_cast<size_t>((x * s + i) * s + j)] = k;
        kept += k, ++total;
      }
  m.kept_fraction = static_cast<double>(kept) / static_cast<double>(total);
  return m;
}

// cuDNN's dropout rate over a large sample (2.1M causal elements, three rates, three keys each): the kept
// fraction within 6 standard deviations (~3e-4 each) of 1 - p — the one-shape test below saw 3.2 sd once.
TEST(CudaFlashAttention, CudnnDropoutKeepsOneMinusPOverManyElements) {
  MCPP_REQUIRE_CUDA();
  const CudnnAttentionScope cudnn(true);
  const int64_t b = 16, nq = 16, s = 128;
  const double n = static_cast<double>(b * nq * s * (s + 1) / 2);
  for (float p : {0.1f, 0.3f, 0.5f}) {
    double kept = 0;
    const uint64_t offsets[] = {11, 1u << 20, 12345679};
    for (uint64_t off : offsets) {
      const auto c0 = ops::cuda_cudnn_attention_counts();
      const CudnnMask m = recover_cudnn_mask(b, nq, s, p, {.seed = 99 + off, .offset = off});
      if (ops::cuda_cudnn_attention_counts().fwd == c0.fwd)
        GTEST_SKIP() << "cuDNN's fused attention with dropout is not available here (the mcpp kernels ran)";
      kept += m.kept_fraction / 3.0;
    }
    const double sd = std::sqrt(p * (1.0 - p) / (3.0 * n));
    std::printf("[ measured ] cuDNN dropout p=%.2f kept %.5f over %.0f elements (expected %.5f, sd %.5f: %+.1f sd)\n",
                p, kept, 3.0 * n, 1.0 - p, sd, (kept - (1.0 - p)) / sd);
    EXPECT_NEAR(kept, 1.0 - p, 6 * sd) << "p = " << p;
  }
}

TEST(CudaFlashAttention, CudnnDropoutMaskIsBernoulliAndMatchesAFloat64Reference) {
  MCPP_REQUIRE_CUDA();
  const CudnnAttentionScope cudnn(true);
  const int64_t b = 2, nq = 4, s = 128, d = 128;
  const float p = 0.3f;
  const PhiloxKey key{.seed = 1234, .offset = 7};
  const auto c0 = ops::cuda_cudnn_attention_counts();
  const CudnnMask m = recover_cudnn_mask(b, nq, s, p, key);
  if (ops::cuda_cudnn_attention_counts().fwd == c0.fwd)
    GTEST_SKIP() << "cuDNN's fused attention with dropout is not available here (the mcpp kernels ran)";
  const double n = static_cast<double>(b * nq * s * (s + 1) / 2), sd = std::sqrt(p * (1.0 - p) / n);
  std::printf("[ measured ] cuDNN dropout p=%.2f kept %.4f (expected %.4f, sd %.4f)\n", p, m.kept_fraction,
              1.0 - p, sd);
  EXPECT_NEAR(m.kept_fraction, 1.0 - p, 7 * sd);
  EXPECT_EQ(recover_cudnn_mask(b, nq, s, p, key).keep, m.keep) << "the same key must repeat the mask";
  const CudnnMask other = recover_cudnn_mask(b, nq, s, p, {.seed = 1234, .offset = 7 + 4096});
  size_t differ = 0;
  for (size_t i = 0; i < m.keep.size(); ++i) differ += m.keep[i] != other.keep[i];
  EXPECT_GT(differ, m.keep.size() / 10) << "another offset must draw another mask";
  Tensor base = Tensor::empty({1}, DType::I64);  // a CUDA-graph key: offset 7 relative to a device base 4096
  base.data<int64_t>()[0] = 4096;
  const Tensor base_d = base.to(Device::CUDA);
  const PhiloxKey rel{.seed = 1234, .offset = 7, .device_base = static_cast<const uint64_t*>(base_d.raw())};
  EXPECT_EQ(recover_cudnn_mask(b, nq, s, p, rel).keep, other.keep) << "device-base key != its absolute offset";

  // Random inputs, the same key: float64 reference with the recovered mask z (keep / (1 - p)).
  const DType bf = DType::BF16;
  const Shape qs{s, b, nq, d};
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  Tensor q = rnd(qs, 1, bf, -2, 2), k = rnd(qs, 2, bf, -2, 2), v = rnd(qs, 3, bf), dout = rnd(qs, 4, bf);
  auto at = [&](const Tensor& t, int64_t i, int64_t x, int64_t c) {
    return static_cast<double>(t.data<float>()[(i * b * nq + x) * d + c]);
  };
  Tensor o_ref = Tensor::zeros(qs), dq_ref = Tensor::zeros(qs), dk_ref = Tensor::zeros(qs), dv_ref = Tensor::zeros(qs);
  auto add = [&](Tensor& t, int64_t i, int64_t x, int64_t c, double val) {
    t.data<float>()[(i * b * nq + x) * d + c] += static_cast<float>(val);
  };
  for (int64_t x = 0; x < b * nq; ++x)
    for (int64_t i = 0; i < s; ++i) {
      std::vector<double> P(static_cast<size_t>(i + 1)), z(P.size()), dP(P.size());
      double mx = -INFINITY, sum = 0, D = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += at(q, i, x, c) * at(k, j, x, c);
        P[j] = dot * scale;
        mx = std::max(mx, P[j]);
        z[j] = m.keep[static_cast<size_t>((x * s + i) * s + j)] ? 1.0 / (1.0 - p) : 0.0;
      }
      for (double& e : P) sum += (e = std::exp(e - mx));
      for (int64_t j = 0; j <= i; ++j) {
        P[j] /= sum;
        double dpr = 0;
        for (int64_t c = 0; c < d; ++c) {
          add(o_ref, i, x, c, P[j] * z[j] * at(v, j, x, c));
          dpr += at(dout, i, x, c) * at(v, j, x, c);
          add(dv_ref, j, x, c, P[j] * z[j] * at(dout, i, x, c));
        }
        dP[j] = dpr * z[j];
        D += P[j] * dP[j];
      }
      for (int64_t j = 0; j <= i; ++j) {
        const double ds = P[j] * (dP[j] - D) * scale;
        for (int64_t c = 0; c < d; ++c) {
          add(dq_ref, i, x, c, ds * at(k, j, x, c));
          add(dk_ref, j, x, c, ds * at(q, i, x, c));
        }
      }
    }
  const ops::AttentionOptions opt{.softmax_scale = scale, .causal = true, .dropout_p = p, .dropout_key = key};
  Tensor qd = dev(q, bf), kd = dev(k, bf), vd = dev(v, bf), dod = dev(dout, bf);
  Tensor o = poisoned(qs, bf), lse = poisoned({b, nq, s}, DType::F32);
  ops::flash_attention_fwd(o, lse, qd, kd, vd, opt);
  EXPECT_REL(host(o), o_ref, 1e-2);
  for (bool deterministic : {false, true}) {
    SCOPED_TRACE(deterministic ? "deterministic backward graph" : "default backward graph");
    ops::AttentionOptions bopt = opt;
    bopt.deterministic = deterministic;
    Tensor dq = poisoned(qs, bf), dk = poisoned(qs, bf), dv = poisoned(qs, bf);
    const auto before = ops::cuda_cudnn_attention_counts();
    ops::flash_attention_bwd(dq, dk, dv, dod, qd, kd, vd, o, lse, bopt);
    EXPECT_EQ(ops::cuda_cudnn_attention_counts().bwd, before.bwd + 1) << "the backward must run on cuDNN too";
    EXPECT_REL(host(dq), dq_ref, 2e-2);
    EXPECT_REL(host(dk), dk_ref, 2e-2);
    EXPECT_REL(host(dv), dv_ref, 2e-2);
  }
}

// A CUDA-graph key (offset relative to a device base, core/rng.h) draws the mask of the absolute offset.
TEST(CudaFlashAttention, DropoutDeviceBaseKeyEqualsTheAbsoluteOffset) {
  MCPP_REQUIRE_CUDA();
  const CudnnAttentionScope mcpp_kernels(false);  // the CPU's mask (cuDNN's: the Bernoulli test below)
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

// Head dims that are not a multiple of 8, or beyond 256: one named error, fp32 and bf16.
TEST(CudaFlashAttention, RejectsUnsupportedHeadDim) {
  MCPP_REQUIRE_CUDA();
  Tensor lse = Tensor::zeros({1, 2, 4}, DType::F32, Device::CUDA);
  for (DType dt : float_dtypes())
    for (int64_t d : {36, 264}) {
      Tensor q = Tensor::zeros({4, 1, 2, d}, dt, Device::CUDA), o = Tensor::zeros({4, 1, 2, d}, dt, Device::CUDA);
      try {
        ops::flash_attention_fwd(o, lse, q, q, q, {});
        ADD_FAILURE() << "head dim " << d << " should be refused";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("head dim d must be a multiple of 8 up to 256"), std::string::npos)
            << e.what();
      }
    }
}

}  // namespace
}  // namespace mcpp
