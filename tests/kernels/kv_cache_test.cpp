// ops::cpu::kv_cache_append / kv_cache_attention (ops.inc): the append writes each sequence's step rows at its own
// cached length and nothing else (bitwise); the attention of sq queries against the cache equals a float64 naive
// softmax over keys 0..lengths[bb] + i (MHA, GQA, MQA; ragged lengths; sq 1 and 3; head dims 8..256; relative 1e-6:
// float32 sums over <= 40 keys), and the flash attention's causal rows: the decode of query i after caching i keys is
// row i of flash_attention_fwd over the whole sequence (1e-6). Bad shapes / overflowing lengths are named errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/grad_check.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {
namespace {
using testing::random_tensor;

Tensor lengths_of(const std::vector<int32_t>& l) {
  Tensor t = Tensor::empty({static_cast<int64_t>(l.size())}, DType::I32);
  std::copy(l.begin(), l.end(), t.data<int32_t>());
  return t;
}

double rel(const Tensor& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double d = got.data<float>()[i] - want[static_cast<size_t>(i)];
    num += d * d;
    den += want[static_cast<size_t>(i)] * want[static_cast<size_t>(i)];
  }
  return std::sqrt(num / den);
}

TEST(KvCacheCpu, AppendWritesEachSequenceAtItsLength) {
  const int64_t cap = 9, b = 3, ng = 2, d = 8, sq = 2;
  Tensor kc = random_tensor({cap, b, ng, d}, 1), vc = random_tensor({cap, b, ng, d}, 2);
  const Tensor kc0 = kc.clone(), vc0 = vc.clone();
  const Tensor k = random_tensor({sq, b, ng, d}, 3), v = random_tensor({sq, b, ng, d}, 4);
  const std::vector<int32_t> len{0, 4, 7};
  ops::kv_cache_append(kc, vc, k, v, lengths_of(len));
  const int64_t row = ng * d;
  for (int64_t j = 0; j < cap; ++j)
    for (int64_t bb = 0; bb < b; ++bb) {
      const int64_t i = j - len[bb];  // the step row written here, if any
      const float* got_k = kc.data<float>() + (j * b + bb) * row;
      const float* got_v = vc.data<float>() + (j * b + bb) * row;
      const float* want_k = (i >= 0 && i < sq ? k.data<float>() + (i * b + bb) * row : kc0.data<float>() + (j * b + bb) * row);
      const float* want_v = (i >= 0 && i < sq ? v.data<float>() + (i * b + bb) * row : vc0.data<float>() + (j * b + bb) * row);
      EXPECT_EQ(std::memcmp(got_k, want_k, sizeof(float) * row), 0) << "row " << j << " sequence " << bb;
      EXPECT_EQ(std::memcmp(got_v, want_v, sizeof(float) * row), 0) << "row " << j << " sequence " << bb;
    }
  EXPECT_THROW(ops::kv_cache_append(kc, vc, k, v, lengths_of({0, 4, 8})), Error);  // 8 + 2 > 9 rows
}

void check_attention(int64_t sq, int64_t b, int64_t nq, int64_t ng, int64_t d, const std::vector<int32_t>& len,
                     int64_t cap) {
  SCOPED_TRACE(::testing::Message() << "sq=" << sq << " b=" << b << " nq=" << nq << " ng=" << ng << " d=" << d);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const Tensor q = random_tensor({sq, b, nq, d}, 5, nullptr, -2, 2), kc = random_tensor({cap, b, ng, d}, 6, nullptr, -2, 2),
               vc = random_tensor({cap, b, ng, d}, 7);
  Tensor o = Tensor::empty(q.shape());
  ops::kv_cache_attention(o, q, kc, vc, lengths_of(len), scale);
  std::vector<double> want(static_cast<size_t>(o.numel()));
  for (int64_t i = 0; i < sq; ++i)
    for (int64_t bb = 0; bb < b; ++bb)
      for (int64_t h = 0; h < nq; ++h) {
        const int64_t g = h / (nq / ng), n = len[bb] + i + 1, qr = ((i * b + bb) * nq + h) * d;
        std::vector<double> p(static_cast<size_t>(n));
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < n; ++j) {
          double dot = 0;
          for (int64_t t = 0; t < d; ++t) dot += static_cast<double>(q.data<float>()[qr + t]) * kc.data<float>()[((j * b + bb) * ng + g) * d + t];
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        for (int64_t j = 0; j < n; ++j) sum += p[j] = std::exp(p[j] - mx);
        for (int64_t t = 0; t < d; ++t) {
          double acc = 0;
          for (int64_t j = 0; j < n; ++j) acc += p[j] * vc.data<float>()[((j * b + bb) * ng + g) * d + t];
          want[static_cast<size_t>(qr + t)] = acc / sum;
        }
      }
  EXPECT_LT(rel(o, want), 1e-6);
}

TEST(KvCacheCpu, AttentionMatchesFloat64) {
  check_attention(1, 3, 4, 2, 16, {0, 5, 38}, 40);   // GQA, ragged, a first token (no earlier key)
  check_attention(3, 2, 4, 4, 8, {2, 30}, 40);       // MHA, three queries each (causal among them)
  check_attention(1, 2, 6, 1, 256, {12, 1}, 16);     // MQA, head dim 256
  check_attention(1, 1, 2, 2, 80, {20}, 21);         // head dim 80, the cache full
}

// Decoding one token at a time through the cache gives the flash attention's causal rows (over the same q, k, v).
TEST(KvCacheCpu, DecodeStepsEqualTheFlashAttentionRows) {
  const int64_t s = 13, b = 2, nq = 4, ng = 2, d = 32;
  const Tensor q = random_tensor({s, b, nq, d}, 11, nullptr, -2, 2), k = random_tensor({s, b, ng, d}, 12, nullptr, -2, 2),
               v = random_tensor({s, b, ng, d}, 13);
  const ops::AttentionOptions opt{.softmax_scale = 0.2f, .causal = true};
  Tensor o = Tensor::empty(q.shape()), lse = Tensor::empty({b, nq, s});
  ops::flash_attention_fwd(o, lse, q, k, v, opt);
  Tensor kc = Tensor::zeros({s, b, ng, d}), vc = Tensor::zeros({s, b, ng, d});
  std::vector<double> want, got;
  for (int64_t i = 0; i < s; ++i) {
    const Tensor lengths = lengths_of({static_cast<int32_t>(i), static_cast<int32_t>(i)});
    ops::kv_cache_append(kc, vc, k.narrow0(i, 1), v.narrow0(i, 1), lengths);
    Tensor oi = Tensor::empty({1, b, nq, d});
    ops::kv_cache_attention(oi, q.narrow0(i, 1), kc, vc, lengths, opt.softmax_scale);
    const Tensor ref = o.narrow0(i, 1);
    got.insert(got.end(), oi.data<float>(), oi.data<float>() + oi.numel());
    want.insert(want.end(), ref.data<float>(), ref.data<float>() + ref.numel());
  }
  Tensor g = Tensor::empty({static_cast<int64_t>(got.size())});
  std::copy(got.begin(), got.end(), g.data<float>());
  EXPECT_LT(rel(g, want), 1e-6);
}

TEST(KvCacheCpu, BadArgumentsAreNamedErrors) {
  Tensor kc = Tensor::zeros({8, 2, 2, 16}), vc = Tensor::zeros({8, 2, 2, 16}), q = Tensor::zeros({1, 2, 4, 16});
  Tensor o = Tensor::empty(q.shape());
  auto has = [](auto&& f, const char* what) {
    try {
      f();
      ADD_FAILURE() << "no error, expected " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  has([&] { ops::kv_cache_attention(o, q, kc, vc, lengths_of({1}), 1.0f); }, "lengths must be int32 [b=2]");
  has([&] { ops::kv_cache_attention(o, q, kc, vc, lengths_of({1, 8}), 1.0f); }, "exceed the cache's capacity 8");
  Tensor q3 = Tensor::zeros({1, 2, 3, 16}), o3 = Tensor::empty(q3.shape());
  has([&] { ops::kv_cache_attention(o3, q3, kc, vc, lengths_of({1, 1}), 1.0f); }, "multiple of the cache's 2 groups");
  Tensor vbad = Tensor::zeros({8, 2, 2, 8});
  has([&] { ops::kv_cache_attention(o, q, kc, vbad, lengths_of({1, 1}), 1.0f); }, "v_cache must match k_cache");
}

}  // namespace
}  // namespace mcpp
