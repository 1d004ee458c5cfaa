// ops::cpu::embedding_fwd / embedding_bwd: vocab-partition lookup vs a float64 reference and finite
// differences of L = sum(dout * embedding(table)), with += into the table gradient.
#include <gtest/gtest.h>

#include "kernels/grad_check.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {
namespace {
using namespace mcpp::testing;
namespace cpu = mcpp::ops::cpu;

std::vector<double> ref_embed(const std::vector<double>& table, const std::vector<int32_t>& ids, int64_t v,
                              int64_t h, int64_t start) {
  std::vector<double> out(ids.size() * static_cast<size_t>(h), 0.0);
  for (size_t t = 0; t < ids.size(); ++t) {
    const int64_t r = ids[t] - start;
    if (r < 0 || r >= v) continue;
    for (int64_t c = 0; c < h; ++c) out[t * h + c] = table[r * h + c];
  }
  return out;
}

Tensor ids_tensor(const std::vector<int32_t>& ids, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::I32);
  for (size_t i = 0; i < ids.size(); ++i) t.data<int32_t>()[i] = ids[i];
  return t;
}

TEST(CpuEmbedding, PartitionLookupAndAccumulatingBackward) {
  // This rank holds vocab rows [10, 16); ids outside give zero rows and no gradient. Ids repeat, so
  // the backward must sum duplicate rows.
  const int64_t v = 6, h = 5, start = 10;
  const std::vector<int32_t> ids = {10, 3, 15, 12, 12, 16, 10, 11};  // [s=4, b=2]
  std::vector<double> table, dout, d0;
  Tensor tt = random_tensor({v, h}, 1, &table);
  Tensor tid = ids_tensor(ids, {4, 2});
  Tensor out = Tensor::empty({4, 2, h});
  out.fill_(5.0f);  // overwritten, including the zero rows
  cpu::embedding_fwd(out, tid, tt, start, {});
  EXPECT_EQ(to_doubles(out), ref_embed(table, ids, v, h, start));  // a copy: exact

  Tensor tdout = random_tensor({4, 2, h}, 2, &dout);
  Tensor dtable = random_tensor({v, h}, 3, &d0);
  cpu::embedding_bwd(dtable, tid, tdout, start, {});
  auto want = numeric_grad([&](const std::vector<double>& tv) { return dot(dout, ref_embed(tv, ids, v, h, start)); },
                           table);
  for (size_t i = 0; i < want.size(); ++i) want[i] += d0[i];
  // Sums of <= 3 fp32 values: ~1e-7 relative; 1e-6 against a 1e-2 floor.
  EXPECT_LT(max_rel_error(dtable, want, 1e-2), 1e-6);
  // Rows 14 - 10 = 4 (no id 14) keep exactly their prefilled value.
  for (int64_t c = 0; c < h; ++c) EXPECT_EQ(dtable.data<float>()[4 * h + c], static_cast<float>(d0[4 * h + c]));
}

TEST(CpuEmbedding, LargeBackwardMatchesInOrderSum) {
  // n*h above the OpenMP threshold; each element must be the in-order fp32 sum of its tokens' rows.
  const int64_t v = 50, h = 130, n = 700;
  std::vector<int32_t> ids(n);
  for (int64_t t = 0; t < n; ++t) ids[t] = static_cast<int32_t>((t * 7) % v);
  Tensor tid = ids_tensor(ids, {n});
  std::vector<double> dout;
  Tensor tdout = random_tensor({n, h}, 4, &dout);
  Tensor dtable = Tensor::zeros({v, h});
  cpu::embedding_bwd(dtable, tid, tdout, 0, {});
  std::vector<float> want(static_cast<size_t>(v * h), 0.0f);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < h; ++c) want[ids[t] * h + c] += static_cast<float>(dout[t * h + c]);
  for (int64_t i = 0; i < v * h; ++i) ASSERT_EQ(dtable.data<float>()[i], want[i]) << i;  // same order: exact
}

TEST(CpuEmbedding, RejectsBadArguments) {
  Tensor table = Tensor::zeros({6, 4}), out = Tensor::zeros({3, 4});
  Tensor ids64 = Tensor::zeros({3}, DType::I64);
  try {
    cpu::embedding_fwd(out, ids64, table, 0, {});
    FAIL() << "expected mcpp::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("embedding_fwd: ids must be a CPU int32 tensor"), std::string::npos)
        << e.what();
  }
  Tensor ids = Tensor::zeros({2}, DType::I32);
  EXPECT_THROW(cpu::embedding_fwd(out, ids, table, 0, {}), Error);
  Tensor dout_bad = Tensor::zeros({2, 5});
  EXPECT_THROW(cpu::embedding_bwd(table, ids, dout_bad, 0, {}), Error);
}

}  // namespace
}  // namespace mcpp
