// flash_attention_{fwd,bwd}_qkv on the CPU backend: defined as qkv_split + flash_attention_fwd and
// flash_attention_bwd + qkv_merge, so the outputs must be BITWISE those of that composition (MHA, GQA, MQA,
// causal and full, s not a multiple of the 64-row tile); every malformed argument is an mcpp::Error naming
// the field (num_query_groups, qkv, dqkv, o, the dtype).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/core_test_util.h"
#include "kernels/grad_check.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {
namespace {

Tensor nan_filled(const Shape& shape) {
  Tensor t = Tensor::empty(shape);
  std::fill_n(t.data<float>(), t.numel(), NAN);
  return t;
}

float max_abs(const Tensor& t) {
  float m = 0.0f;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(t.data<float>()[i]));
  return m;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

void check_composition(int64_t s, int64_t b, int64_t nq, int64_t ng, int64_t d, bool causal) {
  SCOPED_TRACE(::testing::Message() << "s=" << s << " b=" << b << " nq=" << nq << " ng=" << ng << " d=" << d
                                    << " causal=" << causal);
  const ops::AttentionOptions opt{.softmax_scale = 1.0f / std::sqrt(static_cast<float>(d)), .causal = causal};
  Tensor qkv = testing::random_tensor({s, b, (nq + 2 * ng) * d}, 21, nullptr, -2.0, 2.0);
  Tensor dout = testing::random_tensor({s, b, nq, d}, 22);
  // The composition (today's split path).
  Tensor q = Tensor::empty({s, b, nq, d}), k = Tensor::empty({s, b, ng, d}), v = Tensor::empty({s, b, ng, d});
  ops::qkv_split(q, k, v, qkv);
  Tensor o_ref = Tensor::empty({s, b, nq, d}), lse_ref = Tensor::empty({b, nq, s});
  ops::flash_attention_fwd(o_ref, lse_ref, q, k, v, opt);
  Tensor dq = Tensor::empty(q.shape()), dk = Tensor::empty(k.shape()), dv = Tensor::empty(v.shape());
  ops::flash_attention_bwd(dq, dk, dv, dout, q, k, v, o_ref, lse_ref, opt);
  Tensor dqkv_ref = Tensor::empty(qkv.shape());
  ops::qkv_merge(dqkv_ref, dq, dk, dv);
  // The packed ops, into NaN-filled outputs (an unwritten element cannot compare equal).
  Tensor o = nan_filled({s, b, nq, d}), lse = nan_filled({b, nq, s});
  ops::flash_attention_fwd_qkv(o, lse, qkv, ng, opt);
  EXPECT_TRUE(same_bits(o, o_ref)) << "o";
  EXPECT_TRUE(same_bits(lse, lse_ref)) << "lse";
  Tensor dqkv = nan_filled(qkv.shape());
  ops::flash_attention_bwd_qkv(dqkv, dout, qkv, o, lse, ng, opt);
  EXPECT_TRUE(same_bits(dqkv, dqkv_ref)) << "dqkv";
  // The reference is not degenerate: every gradient section (q, k, v rows) carries signal.
  EXPECT_GT(max_abs(dq), 0.0f);
  EXPECT_GT(max_abs(dk), 0.0f);
  EXPECT_GT(max_abs(dv), 0.0f);
}

TEST(FlashAttentionQkv, EqualsSplitAttentionMergeBitwise) {
  for (bool causal : {true, false}) {
    check_composition(70, 2, 4, 4, 16, causal);  // MHA, s not a tile multiple
    check_composition(70, 2, 4, 2, 8, causal);   // GQA r = 2
    check_composition(33, 3, 8, 2, 16, causal);  // GQA r = 4
    check_composition(9, 1, 3, 1, 8, causal);    // MQA
  }
  check_composition(130, 1, 4, 2, 64, true);  // the CUDA head dim, three query tiles
}

using mcpp::testing::error_of;

TEST(FlashAttentionQkv, BadArgumentsNameTheField) {
  const int64_t s = 5, b = 2, nq = 4, ng = 2, d = 8;
  const ops::AttentionOptions opt{};
  Tensor qkv = Tensor::zeros({s, b, (nq + 2 * ng) * d}), o = Tensor::empty({s, b, nq, d});
  Tensor lse = Tensor::empty({b, nq, s}), dqkv = Tensor::empty(qkv.shape());
  auto has = [](const std::string& msg, const std::string& what) {
    EXPECT_NE(msg.find(what), std::string::npos)
        << "expected '" << what << "' in: " << (msg.empty() ? "<no error>" : msg);
  };
  // ng does not divide nq / is not positive
  has(error_of([&] { ops::flash_attention_fwd_qkv(o, lse, qkv, 3, opt); }), "num_query_groups=3");
  has(error_of([&] { ops::flash_attention_fwd_qkv(o, lse, qkv, 0, opt); }), "num_query_groups=0");
  // qkv width not (nq + 2 ng) d, or not 3-D
  Tensor narrow = Tensor::zeros({s, b, (nq + 2 * ng) * d - d});
  has(error_of([&] { ops::flash_attention_fwd_qkv(o, lse, narrow, ng, opt); }), "qkv must be [s, b, (nq + 2 ng) d]");
  Tensor four_d = Tensor::zeros({s, b, ng, (nq / ng + 2) * d});
  has(error_of([&] { ops::flash_attention_fwd_qkv(o, lse, four_d, ng, opt); }), "qkv must be [s, b, (nq + 2 ng) d]");
  // qkv's s / b differ from o's
  Tensor short_s = Tensor::zeros({s - 1, b, (nq + 2 * ng) * d});
  has(error_of([&] { ops::flash_attention_fwd_qkv(o, lse, short_s, ng, opt); }), "qkv must be");
  // o not [s, b, nq, d]
  Tensor o3 = Tensor::empty({s, b, nq * d});
  has(error_of([&] { ops::flash_attention_fwd_qkv(o3, lse, qkv, ng, opt); }), "o must be [s, b, nq, d]");
  // dtype: the CPU attention is float32
  Tensor qkv_bf16 = qkv.to(DType::BF16);
  has(error_of([&] { ops::flash_attention_fwd_qkv(o, lse, qkv_bf16, ng, opt); }), "qkv must be float32");
  // backward: dqkv's shape, o vs dout, lse (checked by the attention op it runs)
  Tensor dout = Tensor::zeros({s, b, nq, d});
  Tensor dqkv_bad = Tensor::empty({s, b, nq * d});
  has(error_of([&] { ops::flash_attention_bwd_qkv(dqkv_bad, dout, qkv, o, lse, ng, opt); }),
      "dqkv must have the shape of qkv");
  Tensor o_bad = Tensor::empty({s, b, nq, 2 * d});
  has(error_of([&] { ops::flash_attention_bwd_qkv(dqkv, dout, qkv, o_bad, lse, ng, opt); }),
      "o must have the shape of dout");
  has(error_of([&] { ops::flash_attention_bwd_qkv(dqkv, dout, qkv, o, lse, 3, opt); }), "num_query_groups=3");
  Tensor lse_bad = Tensor::empty({b, nq, s + 1});
  has(error_of([&] { ops::flash_attention_fwd_qkv(o, lse_bad, qkv, ng, opt); }), "lse");
}

}  // namespace
}  // namespace mcpp
