// The ring attention (--cp-comm-type p2p; transformer/ring_attention.h) on the CPU backend: its block schedule
// covers the causal mask exactly once, its per-rank steps over a simulated CP group (ring_sim.h) equal one causal
// flash attention over the whole sequence (forward, lse and all three gradients; MHA and GQA, cp 2 / 3 / 4; with
// attention dropout the same mask as the single call's), the
// load-balanced rows are Megatron's, and ops::attention_merge's log-sum-exp algebra (including -inf rows) holds
// against float64 arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <tuple>

#include "kernels/grad_check.h"
#include "mcpp/core/error.h"
#include "transformer/ring_sim.h"

namespace mcpp {
namespace {

// Rank r's two halves are global chunks r and 2cp-1-r; over its cp steps it must compute every causal
// (query chunk, key chunk) pair of its queries once, with the mask only on the diagonal.
TEST(RingAttention, BlocksCoverTheCausalMaskOnce) {
  for (int cp = 1; cp <= 6; ++cp) {
    std::set<std::tuple<int, int>> seen;
    for (int r = 0; r < cp; ++r) {
      const int chunk[2] = {r, 2 * cp - 1 - r};
      for (int i = 0; i < cp; ++i) {
        const int j = ((r - i) % cp + cp) % cp;
        const int kchunk[2] = {j, 2 * cp - 1 - j};
        for (const ring_attention::Block& blk : ring_attention::blocks(i, r, cp)) {
          const int qc = chunk[blk.q_half], kc = kchunk[blk.k_half];
          EXPECT_LE(kc, qc) << "cp " << cp << " rank " << r << " step " << i << ": a block in the future";
          EXPECT_EQ(blk.causal, kc == qc) << "cp " << cp << " rank " << r << " step " << i;
          EXPECT_TRUE(seen.insert({qc, kc}).second) << "cp " << cp << ": chunk pair twice " << qc << "," << kc;
        }
      }
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(2 * cp * (2 * cp + 1) / 2)) << "cp " << cp;  // every kc <= qc
  }
  EXPECT_THROW(ring_attention::blocks(2, 0, 2), Error);
}

TEST(RingAttention, LoadBalancedRowsAreMegatrons) {
  const std::vector<CpRows> r1 = cp_rows(16, 4, 1, true);  // chunks of 2: rank 1 holds chunks 1 and 6
  ASSERT_EQ(r1.size(), 2u);
  EXPECT_EQ(r1[0].first, 2);
  EXPECT_EQ(r1[1].first, 12);
  EXPECT_EQ(r1[1].count, 2);
  const std::vector<CpRows> c2 = cp_rows(16, 4, 2, false);  // the all-to-all form: contiguous
  ASSERT_EQ(c2.size(), 1u);
  EXPECT_EQ(c2[0].first, 8);
  EXPECT_EQ(c2[0].count, 4);
  EXPECT_THROW(cp_rows(12, 4, 0, true), Error);  // 12 rows are not 8 chunks
  Tensor t = Tensor::empty({8, 3});
  for (int64_t i = 0; i < 24; ++i) t.data<float>()[i] = static_cast<float>(i);
  const Tensor got = cp_take_rows(t, cp_rows(8, 2, 0, true));  // chunks 0 and 3: rows 0, 1, 6, 7
  ASSERT_EQ(got.shape(), Shape({4, 3}));
  EXPECT_EQ(got.data<float>()[2 * 3], 18.0f);
  EXPECT_EQ(got.data<float>()[3 * 3 + 2], 23.0f);
}

void expect_close(const char* what, const Tensor& got, const Tensor& want, double tol) {
  const std::vector<double> g = testing::to_doubles(got), w = testing::to_doubles(want);
  ASSERT_EQ(g.size(), w.size()) << what;
  EXPECT_LT(testing::max_abs_error(g, w), tol) << what;
}

TEST(RingAttention, StepsEqualOneCausalAttention) {
  struct Case {
    int cp;
    int64_t c, b, nq, ng, d;
  };
  for (const Case& cs : {Case{2, 5, 2, 4, 4, 8}, Case{2, 8, 1, 4, 2, 16}, Case{3, 4, 2, 6, 3, 8},
                         Case{4, 3, 2, 2, 1, 16}}) {
    SCOPED_TRACE(::testing::Message() << "cp " << cs.cp << " c " << cs.c << " nq " << cs.nq << " ng " << cs.ng);
    const int64_t S = 2 * cs.cp * cs.c;
    const Shape qs{S, cs.b, cs.nq, cs.d}, ks{S, cs.b, cs.ng, cs.d};
    const Tensor q = testing::random_tensor(qs, 1, nullptr, -2, 2), k = testing::random_tensor(ks, 2, nullptr, -2, 2);
    const Tensor v = testing::random_tensor(ks, 3), dout = testing::random_tensor(qs, 4);
    for (float drop : {0.0f, 0.25f}) {  // with dropout: each block draws its part of the whole mask
      SCOPED_TRACE(drop);
      const ops::AttentionOptions opt{.softmax_scale = 1.0f / std::sqrt(static_cast<float>(cs.d)),
                                      .causal = true,
                                      .dropout_p = drop,
                                      .dropout_key = {.seed = 77, .offset = 5}};
      Tensor o = Tensor::empty(qs), lse = Tensor::empty({cs.b, cs.nq, S});
      ops::flash_attention_fwd(o, lse, q, k, v, opt);
      Tensor dq = Tensor::empty(qs), dk = Tensor::empty(ks), dv = Tensor::empty(ks);
      ops::flash_attention_bwd(dq, dk, dv, dout, q, k, v, o, lse, opt);
      const testing::RingSimResult ring = testing::simulate_ring(q, k, v, dout, cs.cp, opt, Device::CPU, DType::F32);
      expect_close("out", ring.out, o, 1e-5);
      expect_close("lse", ring.lse, lse, 1e-5);
      expect_close("dq", ring.dq, dq, 1e-4);
      expect_close("dk", ring.dk, dk, 1e-4);
      expect_close("dv", ring.dv, dv, 1e-4);
    }
  }
  // a block placed outside the mask is a named error
  Tensor q = testing::random_tensor({4, 1, 2, 8}, 1), o = Tensor::empty({4, 1, 2, 8}), l = Tensor::empty({1, 2, 4});
  const ops::AttentionOptions bad{.dropout_p = 0.1f, .dropout_seq_length = 6, .dropout_row_offset = 4};
  EXPECT_THROW(ops::flash_attention_fwd(o, l, q, q, q, bad), Error);
}

// attention_merge against float64: two blocks' (o, lse) merge to the softmax-weighted sum; a row with -inf on one
// side takes the other's values (a NaN left in o_acc's -inf row must not leak); -inf on both leaves it alone.
TEST(AttentionMerge, LogSumExpAlgebraAndEmptyRows) {
  const int64_t s = 3, b = 1, nq = 2, d = 4;
  const float inf = std::numeric_limits<float>::infinity();
  Tensor o = testing::random_tensor({s, b, nq, d}, 7), ob = testing::random_tensor({s, b, nq, d}, 8);
  Tensor l = Tensor::empty({b, nq, s}), lb = Tensor::empty({b, nq, s});
  // lse index h * s + i: (h 0: i 0 both finite, i 1 acc empty, i 2 block empty; h 1: far apart, equal, both empty)
  const float la[6] = {0.5f, -inf, 2.0f, 30.0f, 1.0f, -inf}, lbv[6] = {1.5f, 0.25f, -inf, -40.0f, 1.0f, -inf};
  for (int i = 0; i < 6; ++i) l.data<float>()[i] = la[i], lb.data<float>()[i] = lbv[i];
  o.data<float>()[((1 * b) * nq + 0) * d + 2] = std::nanf("");  // row (i 1, h 0): its lse_acc is -inf
  const std::vector<double> o0 = testing::to_doubles(o), ob0 = testing::to_doubles(ob);
  ops::attention_merge(o, l, ob, lb);
  for (int64_t h = 0; h < nq; ++h)
    for (int64_t i = 0; i < s; ++i) {
      const double a = la[h * s + i], c = lbv[h * s + i];
      const bool ea = std::isinf(a), ec = std::isinf(c);
      const double m = std::max(a, c);
      const double merged = ea ? c : ec ? a : m + std::log(std::exp(a - m) + std::exp(c - m));
      if (ea && ec)
        EXPECT_EQ(l.data<float>()[h * s + i], -inf) << h << "," << i;
      else
        EXPECT_NEAR(l.data<float>()[h * s + i], merged, 1e-5 * std::max(1.0, std::fabs(merged))) << h << "," << i;
      for (int64_t j = 0; j < d; ++j) {
        const size_t at = static_cast<size_t>(((i * b) * nq + h) * d + j);
        const double want = ec ? o0[at] : ea ? ob0[at] : o0[at] * std::exp(a - merged) + ob0[at] * std::exp(c - merged);
        EXPECT_NEAR(o.data<float>()[at], want, 1e-5) << h << "," << i << "," << j;
      }
    }
  Tensor wrong = Tensor::empty({b, nq, s + 1});
  EXPECT_THROW(ops::attention_merge(o, wrong, ob, lb), Error);
}

}  // namespace
}  // namespace mcpp
