// qkv_split / qkv_merge on the CPU backend against an index-by-index transcription of Megatron's
// layout (attention.py: view [s, b, ng, (np/ng + 2) * hn], split into [np/ng * hn, hn, hn]), for MHA
// and GQA, float32 and bf16 (pure data movement: exact); merge is split's inverse.
#include <gtest/gtest.h>

#include <cstring>

#include "kernels/grad_check.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {
namespace {

void check_layout(int64_t s, int64_t b, int64_t nq, int64_t ng, int64_t d, DType dt) {
  Tensor qkv = testing::random_tensor({s, b, (nq + 2 * ng) * d}, 7).to(dt);
  Tensor q = Tensor::empty({s, b, nq, d}, dt), k = Tensor::empty({s, b, ng, d}, dt), v = Tensor::empty({s, b, ng, d}, dt);
  ops::qkv_split(q, k, v, qkv);
  const int64_t r = nq / ng;
  const auto* src = static_cast<const uint8_t*>(qkv.raw());
  const size_t es = dtype_size(dt);
  auto same = [&](const Tensor& t, int64_t t_idx, int64_t src_idx) {
    return std::memcmp(static_cast<const uint8_t*>(t.raw()) + t_idx * es, src + src_idx * es, es) == 0;
  };
  int64_t bad = 0;
  for (int64_t is = 0; is < s; ++is)
    for (int64_t ib = 0; ib < b; ++ib)
      for (int64_t g = 0; g < ng; ++g)
        for (int64_t j = 0; j < r + 2; ++j)
          for (int64_t e = 0; e < d; ++e) {
            const int64_t src_idx = (((is * b + ib) * ng + g) * (r + 2) + j) * d + e;
            if (j < r) bad += !same(q, (((is * b + ib) * nq) + g * r + j) * d + e, src_idx);
            else bad += !same(j == r ? k : v, ((is * b + ib) * ng + g) * d + e, src_idx);
          }
  EXPECT_EQ(bad, 0) << "nq=" << nq << " ng=" << ng;
  Tensor back = Tensor::zeros(qkv.shape(), dt);
  ops::qkv_merge(back, q, k, v);
  EXPECT_EQ(std::memcmp(back.raw(), qkv.raw(), qkv.nbytes()), 0) << "merge is not split's inverse";
}

TEST(QkvSplitMerge, MegatronLayoutMhaAndGqa) {
  for (DType dt : {DType::F32, DType::BF16}) {
    check_layout(5, 3, 4, 4, 8, dt);  // MHA: r = 1
    check_layout(5, 3, 8, 2, 8, dt);  // GQA: r = 4
    check_layout(2, 1, 6, 1, 4, dt);  // MQA
  }
}

TEST(QkvSplitMerge, BadShapesNameTheArgument) {
  Tensor qkv = Tensor::zeros({2, 1, 3 * 8});
  Tensor q = Tensor::empty({2, 1, 1, 8}), k = Tensor::empty({2, 1, 1, 8}), v = Tensor::empty({2, 1, 1, 4});
  EXPECT_THROW(ops::qkv_split(q, k, v, qkv), Error);  // v shape differs from k
  Tensor v2 = Tensor::empty({2, 1, 1, 8});
  Tensor qkv_bad = Tensor::zeros({2, 1, 20});
  try {
    ops::qkv_split(q, k, v2, qkv_bad);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("qkv"), std::string::npos) << e.what();
  }
}

// chunk_transpose (context parallelism's all-to-all layout): out[j, i, :] = in[i, j, :], any dtype, bitwise;
// [a, c, m] -> [c, a, m] -> [a, c, m] is the identity; shape and aliasing errors name the op.
TEST(ChunkTranspose, MovesBlocksAndInvertsItself) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const int64_t a = 5, c = 3, m = 4;
    Tensor in = Tensor::empty({a, c, m}, DType::F32);
    for (int64_t i = 0; i < in.numel(); ++i) in.data<float>()[i] = static_cast<float>(i);
    in = in.to(dt);
    Tensor out = Tensor::zeros({c, a, m}, dt), back = Tensor::zeros({a, c, m}, dt);
    ops::chunk_transpose(out, in, a, c);
    const Tensor f = out.to(DType::F32);
    for (int64_t j = 0; j < c; ++j)
      for (int64_t i = 0; i < a; ++i)
        for (int64_t k = 0; k < m; ++k)
          ASSERT_EQ(f.data<float>()[(j * a + i) * m + k], static_cast<float>((i * c + j) * m + k)) << i << " " << j;
    ops::chunk_transpose(back, out, c, a);
    EXPECT_EQ(std::memcmp(back.raw(), in.raw(), in.nbytes()), 0);
  }
  Tensor x = Tensor::zeros({6, 4});
  Tensor y = Tensor::zeros({6, 4});
  EXPECT_THROW(ops::chunk_transpose(y, x, 5, 2), Error);  // 24 elements are not [5, 2, m]
  EXPECT_THROW(ops::chunk_transpose(x, x, 2, 3), Error);  // aliasing
  Tensor z = Tensor::zeros({6, 4}, DType::BF16);
  EXPECT_THROW(ops::chunk_transpose(z, x, 2, 3), Error);  // dtype
}

}  // namespace
}  // namespace mcpp
