// The KV cache of generation on CUDA against the CPU backend:
//   kv_cache_append: bitwise the CPU's rows (fp32 and bf16 caches; ragged lengths);
//   kv_cache_attention: q / caches / o float32 (relative 1e-5: __expf and another summation order) and bf16 (the
//     output rounding: the suite's 4e-3... 1e-2), head dims 8, 32, 64, 80, 128, 192, 256, MHA / GQA / MQA, sq 1 and
//     3, ragged lengths up to 1,000 cached keys;
//   the model (GPT-2 and Llama style at head dim 64, MLA at DeepSeek's 192, dropless MoE): the cached path's logits
//     after the prefill and every decode step equal the CUDA full forward's last row (fp32 1e-5 relative; bf16 2e-2:
//     the prefill's and the decode's bf16 activations are rounded in other places), and greedy decoding gives the
//     no-cache path's tokens (fp32), single prompts and a ragged batch.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "cuda/cuda_test_util.h"
#include "mcpp/distributed/model_chunk.h"
#include "mcpp/models/gpt/text_generation.h"
#include "models/generation_test_util.h"
#include "models/gpt_test_util.h"

namespace mcpp::cuda_test {
namespace {

Tensor lengths_of(const std::vector<int32_t>& l) {
  Tensor t = Tensor::empty({static_cast<int64_t>(l.size())}, DType::I32);
  std::copy(l.begin(), l.end(), t.data<int32_t>());
  return t;
}

TEST(CudaKvCache, AppendEqualsCpuBitwise) {
  MCPP_REQUIRE_CUDA();
  const int64_t cap = 12, b = 3, ng = 2, d = 24, sq = 3;
  const Tensor lens = lengths_of({0, 5, 9});
  for (DType dt : float_dtypes()) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor kc = rnd({cap, b, ng, d}, 1, dt), vc = rnd({cap, b, ng, d}, 2, dt);
    const Tensor k = rnd({sq, b, ng, d}, 3, dt), v = rnd({sq, b, ng, d}, 4, dt);
    Tensor kd = dev(kc, dt), vd = dev(vc, dt);
    ops::kv_cache_append(kd, vd, dev(k, dt), dev(v, dt), lens.to(Device::CUDA));
    ops::cpu::kv_cache_append(kc, vc, k, v, lens, {});
    EXPECT_EQ(rel_err(host(kd), kc), 0.0);  // pure data movement: bitwise
    EXPECT_EQ(rel_err(host(vd), vc), 0.0);
  }
}

void check_attention(int64_t sq, int64_t b, int64_t nq, int64_t ng, int64_t d, const std::vector<int32_t>& len,
                     int64_t cap, DType dt) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " sq=" << sq << " b=" << b << " nq=" << nq << " ng=" << ng
                                    << " d=" << d << " cap=" << cap);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const Tensor q = rnd({sq, b, nq, d}, 5, dt, -2, 2), kc = rnd({cap, b, ng, d}, 6, dt, -2, 2), vc = rnd({cap, b, ng, d}, 7, dt);
  const Tensor lens = lengths_of(len);
  Tensor o_ref = Tensor::empty(q.shape());
  ops::cpu::kv_cache_attention(o_ref, q, kc, vc, lens, scale, {});
  Tensor o = poisoned(q.shape(), dt);
  ops::kv_cache_attention(o, dev(q, dt), dev(kc, dt), dev(vc, dt), lens.to(Device::CUDA), scale);
  EXPECT_REL(host(o), o_ref, tol(dt, 1e-5));  // fp32: __expf, another order; bf16: the output rounding
}

TEST(CudaKvCache, AttentionMatchesCpu) {
  MCPP_REQUIRE_CUDA();
  for (DType dt : float_dtypes()) {
    check_attention(1, 3, 4, 2, 64, {0, 17, 999}, 1000, dt);  // GQA, ragged, a first token, the cache full
    check_attention(3, 2, 4, 4, 32, {2, 40}, 64, dt);         // three queries a sequence
    check_attention(1, 2, 6, 1, 128, {100, 3}, 128, dt);      // MQA
    for (int64_t d : {8, 80, 192, 256}) check_attention(1, 2, 4, 2, d, {7, 60}, 80, dt);
  }
}

TEST(CudaKvCache, BadArgumentsAreNamedErrors) {
  MCPP_REQUIRE_CUDA();
  Tensor kc = Tensor::zeros({8, 2, 2, 36}, DType::F32, Device::CUDA), q = Tensor::zeros({1, 2, 4, 36}, DType::F32, Device::CUDA);
  Tensor o = Tensor::empty(q.shape(), DType::F32, Device::CUDA);
  const Tensor lens = lengths_of({1, 1}).to(Device::CUDA);
  EXPECT_THROW(ops::kv_cache_attention(o, q, kc, kc, lens, 1.0f), Error);  // head dim 36
  Tensor kb = Tensor::zeros({8, 2, 2, 32}, DType::BF16, Device::CUDA), kf = Tensor::zeros({1, 2, 2, 32}, DType::F32, Device::CUDA);
  EXPECT_THROW(ops::kv_cache_append(kb, kb, kf, kf, lens), Error);  // not the caches' dtype
  EXPECT_THROW(ops::kv_cache_append(kb, kb, kf, kf, lengths_of({1, 1})), Error);  // lengths on the host
}

TransformerConfig gpu_variant(const std::string& name) {
  TransformerConfig c = testing::tiny_gpu_config(name == "gpt2" ? "gpt2" : "llama");
  if (name == "mla") testing::enable_mla(c, testing::mla_gpu_dims());
  if (name == "moe") {
    c.num_moe_experts = 4;
    c.moe_router_topk = 2;
    c.finalize();
  }
  c.validate();
  return c;
}

const std::vector<std::vector<int32_t>> kPrompts = {{5, 16, 41, 7, 300, 2}, {3}, {88, 2, 9, 60, 11, 30, 401, 17, 9}};

TEST(CudaKvCache, ModelCachedLogitsEqualTheFullForward) {
  MCPP_REQUIRE_CUDA();
  for (const std::string name : {"gpt2", "llama", "mla", "moe"})
    for (DType dt : float_dtypes()) {
      if (name == "moe" && dt == DType::BF16) continue;  // bf16 logits may route a near-tie token elsewhere
      SCOPED_TRACE(::testing::Message() << name << " " << dtype_name(dt));
      ModelChunk model(gpu_variant(name), 1234, testing::single_tp(), Device::CUDA, {}, dt);
      const double bound = dt == DType::F32 ? 1e-5 : 2e-2;
      const double one = testing::cached_vs_full_logits(model, {kPrompts[0]}, 8);
      const double ragged = testing::cached_vs_full_logits(model, kPrompts, 6);
      std::printf("[ measured ] %s %s: cached vs full logits %.3g (one prompt), %.3g (ragged batch)\n", name.c_str(),
                  std::string(dtype_name(dt)).c_str(), one, ragged);
      EXPECT_LT(one, bound);
      EXPECT_LT(ragged, bound);
    }
}

TEST(CudaKvCache, GreedyTokensEqualTheNoCachePath) {
  MCPP_REQUIRE_CUDA();
  for (const std::string name : {"gpt2", "llama", "mla"}) {
    SCOPED_TRACE(name);
    ModelChunk model(gpu_variant(name), 1234, testing::single_tp(), Device::CUDA);
    const GenerationOptions cached{.max_new_tokens = 10}, plain{.max_new_tokens = 10, .kv_cache = false};
    const auto batch = generate_batch(model, kPrompts, cached);
    for (size_t i = 0; i < kPrompts.size(); ++i) EXPECT_EQ(batch[i], generate(model, kPrompts[i], plain)) << i;
  }
}

}  // namespace
}  // namespace mcpp::cuda_test
