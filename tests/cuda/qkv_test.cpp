// CUDA qkv_split / qkv_merge against the CPU backend (data movement: bit-exact), MHA and GQA, fp32/bf16; the fused
// qkv_split_rope / qkv_merge_rope bitwise equal to the split / merge composed with rope on the GPU, and to the CPU
// within fp32 rounding.
#include <tuple>

#include "cuda/cuda_test_util.h"

namespace mcpp::cuda_test {
namespace {

TEST(CudaQkv, SplitMergeMatchCpuExactly) {
  MCPP_REQUIRE_CUDA();
  for (DType dt : float_dtypes())
    for (auto [nq, ng] : {std::pair<int64_t, int64_t>{4, 4}, {8, 2}, {6, 1}}) {
      const int64_t s = 7, b = 3, d = 64;
      Tensor qkv = rnd({s, b, (nq + 2 * ng) * d}, 11, dt);
      Tensor q = Tensor::empty({s, b, nq, d}), k = Tensor::empty({s, b, ng, d}), v = Tensor::empty({s, b, ng, d});
      ops::cpu::qkv_split(q, k, v, qkv, {});
      Tensor gq = poisoned(q.shape(), dt), gk = poisoned(k.shape(), dt), gv = poisoned(v.shape(), dt);
      ops::qkv_split(gq, gk, gv, dev(qkv, dt));
      EXPECT_EQ(rel_err(host(gq), q), 0.0);
      EXPECT_EQ(rel_err(host(gk), k), 0.0);
      EXPECT_EQ(rel_err(host(gv), v), 0.0);
      Tensor back = poisoned(qkv.shape(), dt);
      ops::qkv_merge(back, gq, gk, gv);
      EXPECT_EQ(rel_err(host(back), qkv), 0.0) << "nq=" << nq << " ng=" << ng;
    }
}

// Mixed dtypes take the converting (element-wise) path: bf16 qkv -> fp32 heads and back.
TEST(CudaQkv, ConvertingPathMatchesCpu) {
  MCPP_REQUIRE_CUDA();
  const int64_t s = 5, b = 2, nq = 8, ng = 2, d = 64;
  Tensor qkv = rnd({s, b, (nq + 2 * ng) * d}, 12, DType::BF16);  // bf16-representable fp32 values
  Tensor q = Tensor::empty({s, b, nq, d}), k = Tensor::empty({s, b, ng, d}), v = Tensor::empty({s, b, ng, d});
  ops::cpu::qkv_split(q, k, v, qkv, {});
  Tensor gq = poisoned(q.shape(), DType::F32), gk = poisoned(k.shape(), DType::F32), gv = poisoned(v.shape(), DType::F32);
  ops::qkv_split(gq, gk, gv, dev(qkv, DType::BF16));
  EXPECT_EQ(rel_err(host(gq), q), 0.0);
  EXPECT_EQ(rel_err(host(gk), k), 0.0);
  EXPECT_EQ(rel_err(host(gv), v), 0.0);
  Tensor back = poisoned(qkv.shape(), DType::BF16);
  ops::qkv_merge(back, gq, gk, gv);
  EXPECT_EQ(rel_err(host(back), qkv), 0.0);
}

TEST(CudaQkv, SplitRopeAndMergeRopeEqualTheComposition) {
  MCPP_REQUIRE_CUDA();
  const int64_t s = 7, b = 3;
  for (DType dt : float_dtypes())
    for (auto [nq, ng, d, half] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{4, 4, 64, 32}, {16, 4, 128, 64},
                                   {6, 2, 64, 16}, {4, 2, 64, 20}}) {  // the last: rot/2 % 8 != 0 (composition)
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " nq=" << nq << " ng=" << ng << " d=" << d
                                        << " half=" << half);
      Tensor cosv = rnd({s, half}, 9), sinv = rnd({s, half}, 10), c = dev(cosv), sn = dev(sinv);
      Tensor qkv = rnd({s, b, (nq + 2 * ng) * d}, 11, dt), gqkv = dev(qkv, dt);
      // the composition on the GPU
      Tensor cq = poisoned({s, b, nq, d}, dt), ck = poisoned({s, b, ng, d}, dt), cv = poisoned({s, b, ng, d}, dt);
      ops::qkv_split(cq, ck, cv, gqkv);
      ops::rope_fwd(cq, cq, c, sn);
      ops::rope_fwd(ck, ck, c, sn);
      Tensor q = poisoned(cq.shape(), dt), k = poisoned(ck.shape(), dt), v = poisoned(cv.shape(), dt);
      ops::qkv_split_rope(q, k, v, gqkv, c, sn);
      EXPECT_EQ(rel_err(host(q), host(cq)), 0.0);
      EXPECT_EQ(rel_err(host(k), host(ck)), 0.0);
      EXPECT_EQ(rel_err(host(v), host(cv)), 0.0);
      // and the CPU reference (fp32 heads)
      Tensor rq = Tensor::empty({s, b, nq, d}), rk = Tensor::empty({s, b, ng, d}), rv = Tensor::empty({s, b, ng, d});
      ops::cpu::qkv_split_rope(rq, rk, rv, qkv, cosv, sinv, {});
      EXPECT_REL(host(q), rq, tol(dt, 1e-6));
      EXPECT_REL(host(k), rk, tol(dt, 1e-6));
      // backward: rope_bwd of the heads, then the merge
      Tensor dq = rnd(cq.shape(), 12, dt), dk = rnd(ck.shape(), 13, dt), dv = rnd(cv.shape(), 14, dt);
      Tensor gdq = dev(dq, dt), gdk = dev(dk, dt), gdv = dev(dv, dt);
      Tensor rdq = poisoned(cq.shape(), dt), rdk = poisoned(ck.shape(), dt), want = poisoned(qkv.shape(), dt);
      ops::rope_bwd(rdq, gdq, c, sn);
      ops::rope_bwd(rdk, gdk, c, sn);
      ops::qkv_merge(want, rdq, rdk, gdv);
      Tensor got = poisoned(qkv.shape(), dt);
      ops::qkv_merge_rope(got, gdq, gdk, gdv, c, sn);
      EXPECT_EQ(rel_err(host(got), host(want)), 0.0);
      Tensor ref = Tensor::empty(qkv.shape());
      ops::cpu::qkv_merge_rope(ref, dq, dk, dv, cosv, sinv, {});
      EXPECT_REL(host(got), ref, tol(dt, 1e-6));
    }
}

// chunk_transpose on the GPU (strided 2-D copies) against the CPU backend: bitwise, fp32 and bf16, with
// 2-byte rows (m = 1 bf16) and the all-to-all's shapes: a >> c (cp2hp) and a << c (hp2cp).
TEST(CudaChunkTranspose, MatchesCpuExactly) {
  MCPP_REQUIRE_CUDA();
  for (DType dt : float_dtypes())
    for (auto [a, c, m] : {std::tuple<int64_t, int64_t, int64_t>{5, 3, 4}, {64, 2, 96}, {7, 4, 1}, {2, 8, 33}, {2, 4096, 24}}) {
      Tensor in = rnd({a, c, m}, 13, dt);
      Tensor want = Tensor::empty({c, a, m}, in.dtype());
      ops::cpu::chunk_transpose(want, in, a, c, {});
      Tensor got = poisoned({c, a, m}, dt);
      ops::chunk_transpose(got, dev(in, dt), a, c);
      EXPECT_EQ(rel_err(host(got), want), 0.0) << "a=" << a << " c=" << c << " m=" << m;
    }
}

}  // namespace
}  // namespace mcpp::cuda_test
