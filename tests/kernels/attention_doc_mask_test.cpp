// ops::flash_attention_{fwd,bwd} with document masking (AttentionOptions::doc_start, packed sequences) on the CPU:
// equal to running each document on its own (a [len, 1] call per document), o / lse / dq / dk / dv, at s = 200
// (documents crossing the 64-row tiles, a one-token document, GQA) — the tile skips of the kernel (first key block,
// the dK/dV pass's early stop) included. And the checks: doc_start int32 [b, s], causal, a valid start per row.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/transformer/packed_seq_params.h"

namespace mcpp {
namespace {

Tensor random_tensor(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t.data<float>()[i] = static_cast<float>(static_cast<double>(x % 20001) / 10000.0 - 1.0);
  }
  return t;
}

// Rows [first, first + len) of sample ib of x [s, b, n, d] -> [len, 1, n, d].
Tensor rows_of(const Tensor& x, int64_t ib, int64_t first, int64_t len) {
  const int64_t b = x.size(1), nd = x.size(2) * x.size(3);
  Tensor out = Tensor::empty({len, 1, x.size(2), x.size(3)});
  for (int64_t i = 0; i < len; ++i)
    for (int64_t e = 0; e < nd; ++e)
      out.data<float>()[i * nd + e] = x.data<float>()[((first + i) * b + ib) * nd + e];
  return out;
}

// max |packed - separate| over rows [first, first + len) of sample ib (x [s, b, n, d], doc [len, 1, n, d]).
double rows_diff(const Tensor& x, const Tensor& doc, int64_t ib, int64_t first) {
  const Tensor r = rows_of(x, ib, first, doc.size(0));
  double m = 0;
  for (int64_t i = 0; i < r.numel(); ++i) m = std::max(m, std::abs(double(r.data<float>()[i]) - doc.data<float>()[i]));
  return m;
}

TEST(AttentionDocMask, PackedEqualsEachDocumentAlone) {
  const int64_t s = 200, b = 2, nq = 4, ng = 2, d = 16;
  const std::vector<std::vector<int32_t>> cu = {{0, 70, 130, 200}, {0, 1, 150, 200}};
  const PackedSeqParams p = packed_seq_params_from_cu_seqlens(cu, s, {.reset_attention_mask = true});
  const Tensor q = random_tensor({s, b, nq, d}, 1), k = random_tensor({s, b, ng, d}, 2),
               v = random_tensor({s, b, ng, d}, 3), dout = random_tensor({s, b, nq, d}, 4);
  const ops::AttentionOptions opt{.softmax_scale = 0.25f, .causal = true, .doc_start = p.doc_start};
  Tensor o = Tensor::empty(q.shape()), lse = Tensor::empty({b, nq, s});
  ops::flash_attention_fwd(o, lse, q, k, v, opt);
  Tensor dq = Tensor::empty(q.shape()), dk = Tensor::empty(k.shape()), dv = Tensor::empty(v.shape());
  ops::flash_attention_bwd(dq, dk, dv, dout, q, k, v, o, lse, opt);
  for (int64_t ib = 0; ib < b; ++ib)
    for (size_t j = 0; j + 1 < cu[ib].size(); ++j) {
      const int64_t first = cu[ib][j], len = cu[ib][j + 1] - first;
      const Tensor dq1 = rows_of(q, ib, first, len), dk1 = rows_of(k, ib, first, len), dv1 = rows_of(v, ib, first, len);
      const Tensor g1 = rows_of(dout, ib, first, len);
      const ops::AttentionOptions one{.softmax_scale = 0.25f, .causal = true};
      Tensor o1 = Tensor::empty(dq1.shape()), lse1 = Tensor::empty({1, nq, len});
      ops::flash_attention_fwd(o1, lse1, dq1, dk1, dv1, one);
      Tensor gq = Tensor::empty(dq1.shape()), gk = Tensor::empty(dk1.shape()), gv = Tensor::empty(dv1.shape());
      ops::flash_attention_bwd(gq, gk, gv, g1, dq1, dk1, dv1, o1, lse1, one);
      // fp32, the same tiles' sums in another grouping (a document's keys start mid-tile): rounding only.
      const double tol = 1e-5;
      EXPECT_LT(rows_diff(o, o1, ib, first), tol) << "o, sample " << ib << " doc " << j;
      EXPECT_LT(rows_diff(dq, gq, ib, first), tol) << "dq, sample " << ib << " doc " << j;
      EXPECT_LT(rows_diff(dk, gk, ib, first), tol) << "dk, sample " << ib << " doc " << j;
      EXPECT_LT(rows_diff(dv, gv, ib, first), tol) << "dv, sample " << ib << " doc " << j;
      for (int64_t h = 0; h < nq; ++h)
        for (int64_t i = 0; i < len; ++i)
          EXPECT_NEAR(lse.data<float>()[(ib * nq + h) * s + first + i], lse1.data<float>()[h * len + i], tol)
              << "lse, sample " << ib << " doc " << j << " head " << h << " row " << i;
    }
}

TEST(AttentionDocMask, BadDocStartIsNamed) {
  const int64_t s = 8, b = 1, n = 1, d = 4;
  const Tensor q = random_tensor({s, b, n, d}, 1);
  Tensor o = Tensor::empty(q.shape()), lse = Tensor::empty({b, n, s});
  PackedSeqParams p = packed_seq_params_from_cu_seqlens({{0, 3, 8}}, s, {.reset_attention_mask = true});
  EXPECT_THROW(ops::flash_attention_fwd(o, lse, q, q, q, {.causal = false, .doc_start = p.doc_start}), Error);
  p.doc_start.data<int32_t>()[5] = 0;  // a start that moves back
  EXPECT_THROW(ops::flash_attention_fwd(o, lse, q, q, q, {.causal = true, .doc_start = p.doc_start}), Error);
  EXPECT_THROW(ops::flash_attention_fwd(o, lse, q, q, q, {.causal = true, .doc_start = Tensor::empty({b, s})}), Error);
  EXPECT_THROW(packed_seq_params_from_cu_seqlens({{0, 3, 3, 8}}, s, {.reset_attention_mask = true}), Error);
  EXPECT_THROW(packed_seq_params_from_cu_seqlens({{0, 3}}, s, {.reset_position_ids = true}), Error);
}

}  // namespace
}  // namespace mcpp
