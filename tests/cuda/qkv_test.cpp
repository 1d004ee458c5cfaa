// CUDA qkv_split / qkv_merge against the CPU backend (data movement: bit-exact), MHA and GQA, fp32/bf16.
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
