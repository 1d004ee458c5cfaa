// CUDA flash_attention_{fwd,bwd}_qkv, reading Megatron's fused qkv in place through AttnShape::packed_layout:
//   - the mcpp tensor-core kernels (cuDNN switched off) against the CUDA split path they replace —
//     qkv_split + flash_attention_fwd and flash_attention_bwd + qkv_merge — BITWISE: the same kernel
//     arithmetic, only the addressing differs. d 64 and 128, MHA, GQA (nq/ng = 2, 4) and MQA, causal and
//     full, s not a multiple of the 64/128-row tiles.
//   - deterministic mode on cuDNN (its deterministic backward graph, packed strides): repeats bit for bit.
//   - the default mode (cuDNN's fused attention with the packed strides where it has an engine: MHA; GQA
//     takes the split composition, i.e. cuDNN on the split layout) against the CPU op, bf16 tolerance.
//   - the fallback (fp32, or bf16 qkv with fp32 o: split + attention + merge) against the CPU op.
#include <cmath>
#include <cstring>

#include "cuda/cuda_test_util.h"

namespace mcpp {
namespace {
using namespace cuda_test;

struct Case {
  int64_t s, b, nq, ng, d;
  bool causal;
};

bool same_bits(const Tensor& dev_a, const Tensor& dev_b) {
  Tensor a = dev_a.to(Device::CPU), b = dev_b.to(Device::CPU);
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

void check_packed_equals_split(const Case& c, float drop_p = 0.0f) {
  SCOPED_TRACE(::testing::Message() << "s=" << c.s << " b=" << c.b << " nq=" << c.nq << " ng=" << c.ng
                                    << " d=" << c.d << " causal=" << c.causal << " dropout=" << drop_p);
  const DType bf = DType::BF16;
  const ops::AttentionOptions opt{.softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.d)),
                                  .causal = c.causal,
                                  .deterministic = true,
                                  .dropout_p = drop_p,
                                  .dropout_key = {.seed = 7, .offset = 1234}};
  const Shape qs{c.s, c.b, c.nq, c.d}, ks{c.s, c.b, c.ng, c.d}, ls{c.b, c.nq, c.s};
  Tensor qkv = dev(rnd({c.s, c.b, (c.nq + 2 * c.ng) * c.d}, 31, bf, -2, 2), bf);
  Tensor dout = dev(rnd(qs, 32, bf), bf);
  // split path
  Tensor q = poisoned(qs, bf), k = poisoned(ks, bf), v = poisoned(ks, bf);
  ops::qkv_split(q, k, v, qkv);
  Tensor o_ref = poisoned(qs, bf), lse_ref = poisoned(ls, DType::F32);
  ops::flash_attention_fwd(o_ref, lse_ref, q, k, v, opt);
  Tensor dq = poisoned(qs, bf), dk = poisoned(ks, bf), dv = poisoned(ks, bf);
  ops::flash_attention_bwd(dq, dk, dv, dout, q, k, v, o_ref, lse_ref, opt);
  Tensor dqkv_ref = poisoned(qkv.shape(), bf);
  ops::qkv_merge(dqkv_ref, dq, dk, dv);
  // packed path, into poisoned outputs (an unwritten element cannot compare equal)
  Tensor o = poisoned(qs, bf), lse = poisoned(ls, DType::F32);
  ops::flash_attention_fwd_qkv(o, lse, qkv, c.ng, opt);
  EXPECT_TRUE(same_bits(o, o_ref)) << "o";
  EXPECT_TRUE(same_bits(lse, lse_ref)) << "lse";
  Tensor dqkv = poisoned(qkv.shape(), bf);
  ops::flash_attention_bwd_qkv(dqkv, dout, qkv, o_ref, lse_ref, c.ng, opt);
  EXPECT_TRUE(same_bits(dqkv, dqkv_ref)) << "dqkv";
  // The split reference itself is right (so equal-to-it means right): against the CPU packed op.
  Tensor o_cpu = Tensor::empty(qs), lse_cpu = Tensor::empty(ls);
  ops::cpu::flash_attention_fwd_qkv(o_cpu, lse_cpu, host(qkv), c.ng, opt, {});
  EXPECT_REL(host(o), o_cpu, tol(bf, 0));
}

TEST(CudaFlashAttentionQkv, McppKernelsPackedEqualsSplitBitwise) {
  MCPP_REQUIRE_CUDA();
  const CudnnAttentionScope mcpp_kernels(false);
  for (bool causal : {true, false}) {
    check_packed_equals_split({.s = 80, .b = 2, .nq = 4, .ng = 4, .d = 64, .causal = causal});    // MHA
    check_packed_equals_split({.s = 200, .b = 2, .nq = 8, .ng = 4, .d = 64, .causal = causal});   // GQA r = 2
    check_packed_equals_split({.s = 131, .b = 1, .nq = 8, .ng = 2, .d = 128, .causal = causal});  // GQA r = 4
    check_packed_equals_split({.s = 257, .b = 3, .nq = 2, .ng = 2, .d = 128, .causal = causal});  // MHA
    check_packed_equals_split({.s = 45, .b = 2, .nq = 4, .ng = 1, .d = 64, .causal = causal});    // MQA r = 4
  }
  check_packed_equals_split({.s = 1031, .b = 1, .nq = 12, .ng = 12, .d = 64, .causal = true});  // 124M heads
}

// Attention dropout on the mcpp kernels: the packed call is bitwise the split composition, and both match the
// CPU op (the same in-tile mask).
TEST(CudaFlashAttentionQkv, DropoutPackedEqualsSplitBitwiseOnTheMcppKernels) {
  MCPP_REQUIRE_CUDA();
  const CudnnAttentionScope mcpp_kernels(false);
  for (bool causal : {true, false}) {
    check_packed_equals_split({.s = 80, .b = 2, .nq = 4, .ng = 4, .d = 64, .causal = causal}, 0.1f);    // MHA
    check_packed_equals_split({.s = 131, .b = 1, .nq = 8, .ng = 2, .d = 128, .causal = causal}, 0.3f);  // GQA
  }
}

// With cuDNN (default): its mask is a function of the element's (b, h, i, j) and the key, not of the layout —
// the packed graph (MHA: in place) and the split one agree within bf16 rounding; another mask would be O(1)
// away.
TEST(CudaFlashAttentionQkv, CudnnDropoutPackedMatchesSplit) {
  MCPP_REQUIRE_CUDA();
  const CudnnAttentionScope cudnn(true);
  const DType bf = DType::BF16;
  for (int64_t ng : {4, 2}) {
    SCOPED_TRACE(::testing::Message() << "ng=" << ng);
    const int64_t s = 256, b = 2, nq = 4, d = 64;
    const ops::AttentionOptions opt{
        .softmax_scale = 0.125f, .causal = true, .dropout_p = 0.2f, .dropout_key = {.seed = 5, .offset = 99}};
    const Shape qs{s, b, nq, d}, ks{s, b, ng, d}, ls{b, nq, s};
    Tensor qkv = dev(rnd({s, b, (nq + 2 * ng) * d}, 61, bf, -2, 2), bf), dout = dev(rnd(qs, 62, bf), bf);
    Tensor q = poisoned(qs, bf), k = poisoned(ks, bf), v = poisoned(ks, bf);
    ops::qkv_split(q, k, v, qkv);
    Tensor o_split = poisoned(qs, bf), lse_split = poisoned(ls, DType::F32);
    ops::flash_attention_fwd(o_split, lse_split, q, k, v, opt);
    Tensor o = poisoned(qs, bf), lse = poisoned(ls, DType::F32);
    ops::flash_attention_fwd_qkv(o, lse, qkv, ng, opt);
    EXPECT_REL(host(o), host(o_split), 1e-2);
    Tensor dq = poisoned(qs, bf), dk = poisoned(ks, bf), dv = poisoned(ks, bf), dqkv_split = poisoned(qkv.shape(), bf);
    ops::flash_attention_bwd(dq, dk, dv, dout, q, k, v, o_split, lse_split, opt);
    ops::qkv_merge(dqkv_split, dq, dk, dv);
    Tensor dqkv = poisoned(qkv.shape(), bf);
    ops::flash_attention_bwd_qkv(dqkv, dout, qkv, o_split, lse_split, ng, opt);
    EXPECT_REL(host(dqkv), host(dqkv_split), 2e-2);
  }
}

TEST(CudaFlashAttentionQkv, DeterministicCudnnBackwardRepeatsBitForBit) {
  MCPP_REQUIRE_CUDA();
  const DType bf = DType::BF16;
  for (const Case& c : {Case{1024, 4, 12, 12, 64, true}, Case{512, 2, 8, 4, 128, true}}) {
    SCOPED_TRACE(::testing::Message() << "s=" << c.s << " nq=" << c.nq << " ng=" << c.ng << " d=" << c.d);
    const ops::AttentionOptions opt{
        .softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.d)), .causal = c.causal, .deterministic = true};
    Tensor qkv = dev(rnd({c.s, c.b, (c.nq + 2 * c.ng) * c.d}, 41, bf, -2, 2), bf);
    Tensor dout = dev(rnd({c.s, c.b, c.nq, c.d}, 42, bf), bf);
    Tensor o = poisoned({c.s, c.b, c.nq, c.d}, bf), lse = poisoned({c.b, c.nq, c.s}, DType::F32);
    ops::flash_attention_fwd_qkv(o, lse, qkv, c.ng, opt);
    Tensor first = poisoned(qkv.shape(), bf);
    ops::flash_attention_bwd_qkv(first, dout, qkv, o, lse, c.ng, opt);
    for (int rep = 1; rep < 4; ++rep) {
      Tensor again = poisoned(qkv.shape(), bf);
      ops::flash_attention_bwd_qkv(again, dout, qkv, o, lse, c.ng, opt);
      EXPECT_TRUE(same_bits(again, first)) << "repetition " << rep;
    }
    if (c.s > 512) continue;  // the CPU reference of the larger case costs seconds; the smaller one shows
    // it is the backward (against the CPU op)
    Tensor dqkv_cpu = Tensor::empty(qkv.shape());
    ops::cpu::flash_attention_bwd_qkv(dqkv_cpu, host(dout), host(qkv), host(o), host(lse), c.ng, opt, {});
    EXPECT_REL(host(first), dqkv_cpu, tol(bf, 0));
  }
}

// The default (non-deterministic) bf16 dispatch against the CPU op: cuDNN with packed strides for MHA, the
// split composition for GQA.
void check_default_vs_cpu(const Case& c) {
  SCOPED_TRACE(::testing::Message() << "s=" << c.s << " b=" << c.b << " nq=" << c.nq << " ng=" << c.ng
                                    << " d=" << c.d << " causal=" << c.causal);
  const DType bf = DType::BF16;
  const ops::AttentionOptions opt{.softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.d)), .causal = c.causal};
  const Shape qs{c.s, c.b, c.nq, c.d}, ls{c.b, c.nq, c.s};
  Tensor qkv = rnd({c.s, c.b, (c.nq + 2 * c.ng) * c.d}, 51, bf, -2, 2), dout = rnd(qs, 52, bf);
  Tensor o_ref = Tensor::empty(qs), lse_ref = Tensor::empty(ls);
  ops::cpu::flash_attention_fwd_qkv(o_ref, lse_ref, qkv, c.ng, opt, {});
  Tensor o = poisoned(qs, bf), lse = poisoned(ls, DType::F32);
  ops::flash_attention_fwd_qkv(o, lse, dev(qkv, bf), c.ng, opt);
  EXPECT_REL(host(o), o_ref, tol(bf, 0));  // the bf16 output rounding (and cuDNN's bf16 P)
  EXPECT_REL(host(lse), lse_ref, 1e-5);
  Tensor o_in = o_ref.to(bf).to(DType::F32);  // both backward sides see the same (bf16) o
  Tensor dqkv_ref = Tensor::empty(qkv.shape());
  ops::cpu::flash_attention_bwd_qkv(dqkv_ref, dout, qkv, o_in, lse_ref, c.ng, opt, {});
  Tensor dqkv = poisoned(qkv.shape(), bf);
  ops::flash_attention_bwd_qkv(dqkv, dev(dout, bf), dev(qkv, bf), dev(o_in, bf), dev(lse_ref), c.ng, opt);
  EXPECT_REL(host(dqkv), dqkv_ref, tol(bf, 0));
}

TEST(CudaFlashAttentionQkv, DefaultDispatchMatchesCpu) {
  MCPP_REQUIRE_CUDA();
  for (bool causal : {true, false}) {
    check_default_vs_cpu({.s = 1024, .b = 2, .nq = 4, .ng = 4, .d = 64, .causal = causal});   // MHA: cuDNN
    check_default_vs_cpu({.s = 333, .b = 2, .nq = 2, .ng = 2, .d = 128, .causal = causal});   // MHA: cuDNN
    check_default_vs_cpu({.s = 200, .b = 2, .nq = 8, .ng = 2, .d = 64, .causal = causal});    // GQA r = 4
  }
}

// fp32 (and a bf16 qkv with a float32 o) take the explicit fallback: split + the CUDA-core attention + merge.
TEST(CudaFlashAttentionQkv, FallbackMatchesCpu) {
  MCPP_REQUIRE_CUDA();
  for (DType o_dt : {DType::F32, DType::BF16})
    for (DType qkv_dt : {DType::F32, DType::BF16}) {
      if (o_dt == DType::BF16 && qkv_dt == DType::BF16) continue;  // the in-place path (above)
      SCOPED_TRACE(::testing::Message() << "qkv " << dtype_name(qkv_dt) << ", o/dout/dqkv " << dtype_name(o_dt));
      const int64_t s = 70, b = 2, nq = 4, ng = 2, d = 64;
      const ops::AttentionOptions opt{.softmax_scale = 0.125f, .causal = true};
      Tensor qkv = rnd({s, b, (nq + 2 * ng) * d}, 41, qkv_dt, -2, 2), dout = rnd({s, b, nq, d}, 42, o_dt);
      Tensor o_ref = Tensor::empty({s, b, nq, d}), lse_ref = Tensor::empty({b, nq, s});
      ops::cpu::flash_attention_fwd_qkv(o_ref, lse_ref, qkv, ng, opt, {});
      Tensor o = poisoned({s, b, nq, d}, o_dt), lse = poisoned({b, nq, s}, DType::F32);
      ops::flash_attention_fwd_qkv(o, lse, dev(qkv, qkv_dt), ng, opt);
      // fp32: __expf and another summation order (~1e-6); bf16 o: its output rounding
      EXPECT_REL(host(o), o_ref, tol(o_dt, 2e-5));
      EXPECT_REL(host(lse), lse_ref, 1e-5);
      Tensor o_in = o_dt == DType::F32 ? o_ref : o_ref.to(o_dt).to(DType::F32);  // both sides see the same o
      Tensor dqkv_ref = Tensor::empty(qkv.shape());
      ops::cpu::flash_attention_bwd_qkv(dqkv_ref, dout, qkv, o_in, lse_ref, ng, opt, {});
      Tensor dqkv = poisoned(qkv.shape(), o_dt);
      ops::flash_attention_bwd_qkv(dqkv, dev(dout, o_dt), dev(qkv, qkv_dt), dev(o_in, o_dt), dev(lse_ref), ng, opt);
      EXPECT_REL(host(dqkv), dqkv_ref, tol(o_dt, 5e-5));
    }
}

// Every head dim (issue 35) on the packed forms against the CPU op: d = 32, 80, 96, 256 in fp32 (split + the
// CUDA-core kernels + merge) and bf16 — by default (cuDNN in place or split) and with cuDNN off (the composition on the
// CUDA-core kernels) — MHA and GQA, causal, with attention dropout on the mcpp kernels (the CPU's mask).
void check_any_vs_cpu(const Case& c, DType dt, float drop_p) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " s=" << c.s << " b=" << c.b << " nq=" << c.nq
                                    << " ng=" << c.ng << " d=" << c.d << " causal=" << c.causal
                                    << " cudnn=" << ops::cuda::cudnn_attention() << " dropout=" << drop_p);
  const ops::AttentionOptions opt{.softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.d)),
                                  .causal = c.causal,
                                  .dropout_p = drop_p,
                                  .dropout_key = {.seed = 3, .offset = 17}};
  const Shape qs{c.s, c.b, c.nq, c.d}, ls{c.b, c.nq, c.s};
  Tensor qkv = rnd({c.s, c.b, (c.nq + 2 * c.ng) * c.d}, 71, dt, -2, 2), dout = rnd(qs, 72, dt);
  Tensor o_ref = Tensor::empty(qs), lse_ref = Tensor::empty(ls);
  ops::cpu::flash_attention_fwd_qkv(o_ref, lse_ref, qkv, c.ng, opt, {});
  Tensor o = poisoned(qs, dt), lse = poisoned(ls, DType::F32);
  ops::flash_attention_fwd_qkv(o, lse, dev(qkv, dt), c.ng, opt);
  EXPECT_REL(host(o), o_ref, tol(dt, 2e-5));  // fp32: __expf and another summation order; bf16: the output rounding
  EXPECT_REL(host(lse), lse_ref, 1e-5);
  Tensor o_in = dt == DType::F32 ? o_ref : o_ref.to(dt).to(DType::F32);  // both backward sides see the same o
  Tensor dqkv_ref = Tensor::empty(qkv.shape());
  ops::cpu::flash_attention_bwd_qkv(dqkv_ref, dout, qkv, o_in, lse_ref, c.ng, opt, {});
  Tensor dqkv = poisoned(qkv.shape(), dt);
  ops::flash_attention_bwd_qkv(dqkv, dev(dout, dt), dev(qkv, dt), dev(o_in, dt), dev(lse_ref), c.ng, opt);
  EXPECT_REL(host(dqkv), dqkv_ref, tol(dt, 5e-5));
}

TEST(CudaFlashAttentionQkv, EveryHeadDimMatchesCpu) {
  MCPP_REQUIRE_CUDA();
  for (bool cudnn : {true, false}) {
    const CudnnAttentionScope scope(cudnn);
    for (DType dt : float_dtypes()) {
      if (cudnn && dt == DType::F32) continue;  // fp32 never takes cuDNN
      check_any_vs_cpu({.s = 70, .b = 2, .nq = 4, .ng = 4, .d = 32, .causal = true}, dt, 0.0f);
      check_any_vs_cpu({.s = 45, .b = 1, .nq = 4, .ng = 2, .d = 80, .causal = true}, dt, 0.0f);
      check_any_vs_cpu({.s = 64, .b = 2, .nq = 2, .ng = 2, .d = 96, .causal = false}, dt, 0.0f);
      check_any_vs_cpu({.s = 37, .b = 1, .nq = 2, .ng = 1, .d = 256, .causal = true}, dt, 0.0f);
    }
  }
  const CudnnAttentionScope mcpp_kernels(false);  // the CPU's dropout mask
  for (DType dt : float_dtypes()) {
    check_any_vs_cpu({.s = 70, .b = 2, .nq = 4, .ng = 2, .d = 32, .causal = true}, dt, 0.2f);
    check_any_vs_cpu({.s = 40, .b = 1, .nq = 2, .ng = 2, .d = 256, .causal = true}, dt, 0.1f);
  }
}

TEST(CudaFlashAttentionQkv, RejectsBadShapesNamingTheField) {
  MCPP_REQUIRE_CUDA();
  const int64_t s = 8, b = 1, nq = 2, ng = 1;
  auto has = [](auto&& f, const char* what) {
    try {
      f();
      ADD_FAILURE() << "no error, expected " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  Tensor lse = Tensor::zeros({b, nq, s}, DType::F32, Device::CUDA);
  Tensor qkv36 = Tensor::zeros({s, b, (nq + 2 * ng) * 36}, DType::BF16, Device::CUDA);
  Tensor o36 = Tensor::zeros({s, b, nq, 36}, DType::BF16, Device::CUDA);
  has([&] { ops::flash_attention_fwd_qkv(o36, lse, qkv36, ng, {}); }, "head dim d must be a multiple of 8 up to 256");
  Tensor qkv32 = Tensor::zeros({s, b, (nq + 2 * ng) * 32}, DType::BF16, Device::CUDA);
  Tensor qkv = Tensor::zeros({s, b, (nq + 2 * ng) * 64}, DType::BF16, Device::CUDA);
  Tensor o = Tensor::zeros({s, b, nq, 64}, DType::BF16, Device::CUDA);
  has([&] { ops::flash_attention_fwd_qkv(o, lse, qkv, 3, {}); }, "num_query_groups=3");
  has([&] { ops::flash_attention_fwd_qkv(o, lse, qkv32, ng, {}); }, "qkv must be [s, b, (nq + 2 ng) d]");
  Tensor lse_bad = Tensor::zeros({b, nq, s + 1}, DType::F32, Device::CUDA);
  has([&] { ops::flash_attention_fwd_qkv(o, lse_bad, qkv, ng, {}); }, "lse must be float32");
  Tensor dqkv_bad = Tensor::zeros({s, b, nq * 64}, DType::BF16, Device::CUDA);
  has([&] { ops::flash_attention_bwd_qkv(dqkv_bad, o, qkv, o, lse, ng, {}); }, "dqkv must have the shape of qkv");
}

}  // namespace
}  // namespace mcpp
