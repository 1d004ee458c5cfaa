// Google Benchmark: CPU flash attention forward and backward at a few (s, b, nq, ng, d), causal, and the
// fused cross entropy forward + backward at V = 50304 (GPT-2 padded vocab).
//
// Counters: "FLOPS" counts the useful matmul work only — causal attention forward 4*b*nq*s^2*d/2
// (QK^T and PV), backward 2.5x that (dV, dP, dK, dQ + the QK^T recompute: 5 of the 7 tile GEMMs our
// deterministic two-pass backward runs) — so the rate is comparable with other implementations.
// Cross entropy reports bytes/s over the logits read (fwd) and read + written (bwd).
// Run: build/bin/attention_bench [--benchmark_filter=...]; threads follow OMP_NUM_THREADS.
#include <benchmark/benchmark.h>

#include <cmath>

#include "mcpp/core/tensor.h"
#include "mcpp/kernels/ops.h"

namespace {

using mcpp::DType;
using mcpp::Tensor;

Tensor filled(const mcpp::Shape& shape, float seed) {
  Tensor t = Tensor::empty(shape);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = std::sin(seed + 0.37f * static_cast<float>(i % 9973));
  return t;
}

struct AttnBuffers {
  Tensor q, k, v, o, lse, dout, dq, dk, dv;
  mcpp::ops::AttentionOptions opt;
  AttnBuffers(int64_t s, int64_t b, int64_t nq, int64_t ng, int64_t d)
      : q(filled({s, b, nq, d}, 1.0f)), k(filled({s, b, ng, d}, 2.0f)), v(filled({s, b, ng, d}, 3.0f)),
        o(Tensor::empty({s, b, nq, d})), lse(Tensor::empty({b, nq, s})), dout(filled({s, b, nq, d}, 4.0f)),
        dq(Tensor::empty({s, b, nq, d})), dk(Tensor::empty({s, b, ng, d})), dv(Tensor::empty({s, b, ng, d})),
        opt{.softmax_scale = 1.0f / std::sqrt(static_cast<float>(d)), .causal = true} {}
};

// args: s, b, nq, ng, d
double causal_fwd_flops(const benchmark::State& st) {
  const double s = st.range(0), b = st.range(1), nq = st.range(2), d = st.range(4);
  return 4.0 * b * nq * s * s * d / 2.0;
}

void BM_FlashAttentionFwd(benchmark::State& st) {
  AttnBuffers x(st.range(0), st.range(1), st.range(2), st.range(3), st.range(4));
  for (auto _ : st) mcpp::ops::cpu::flash_attention_fwd(x.o, x.lse, x.q, x.k, x.v, x.opt, {});
  st.counters["FLOPS"] = benchmark::Counter(causal_fwd_flops(st), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_FlashAttentionBwd(benchmark::State& st) {
  AttnBuffers x(st.range(0), st.range(1), st.range(2), st.range(3), st.range(4));
  mcpp::ops::cpu::flash_attention_fwd(x.o, x.lse, x.q, x.k, x.v, x.opt, {});
  for (auto _ : st)
    mcpp::ops::cpu::flash_attention_bwd(x.dq, x.dk, x.dv, x.dout, x.q, x.k, x.v, x.o, x.lse, x.opt, {});
  st.counters["FLOPS"] =
      benchmark::Counter(2.5 * causal_fwd_flops(st), benchmark::Counter::kIsIterationInvariantRate);
}

void attn_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"s", "b", "nq", "ng", "d"});
  b->Args({512, 1, 8, 8, 64});    // MHA
  b->Args({1024, 1, 8, 2, 64});   // GQA 4:1
  b->Args({2048, 1, 4, 4, 128});  // long, wide heads
  b->Args({1024, 4, 12, 12, 64});  // GPT-2 small heads, b = 4
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_FlashAttentionFwd)->Apply(attn_args);
BENCHMARK(BM_FlashAttentionBwd)->Apply(attn_args);

void BM_CrossEntropy(benchmark::State& st) {
  const int64_t n = st.range(0), V = 50304;
  Tensor logits = filled({n, V}, 5.0f), loss = Tensor::empty({n}), lse = Tensor::empty({n});
  Tensor dloss = filled({n}, 6.0f), dlogits = Tensor::empty({n, V});
  Tensor targets = Tensor::empty({n}, DType::I32);
  for (int64_t i = 0; i < n; ++i) targets.data<int32_t>()[i] = static_cast<int32_t>((i * 7919) % V);
  const bool backward = st.range(1) != 0;
  mcpp::ops::cpu::cross_entropy_fwd(loss, lse, logits, targets, {});  // lse for the backward
  for (auto _ : st) {
    if (backward) mcpp::ops::cpu::cross_entropy_bwd(dlogits, dloss, logits, targets, lse, {});
    else mcpp::ops::cpu::cross_entropy_fwd(loss, lse, logits, targets, {});
  }
  const double bytes = static_cast<double>(n) * V * 4.0 * (backward ? 2.0 : 1.0);
  st.counters["bytes"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_CrossEntropy)
    ->ArgNames({"n", "bwd"})
    ->Args({256, 0})
    ->Args({256, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
