// Google Benchmark of the CPU ops of one demo training step (configs/demo.toml: L=4, h=128, s=128, b=8, V=50304;
// n = b*s = 1024 tokens), at exactly the demo shapes, so their sum can be set against the measured step
// (bench/e2e_cpu.sh). Per step: the LM head (linear fwd + bwd at [1024, 128] x [50304, 128]^T) and the cross
// entropy over [1024, 50304] logits once each; per layer (x4): QKV (128 -> 384), proj (128 -> 128), fc1 (128 -> 512),
// fc2 (512 -> 128) linear fwd + bwd, flash attention fwd + bwd (4 heads of 32), 2 LayerNorms, GELU on [1024, 512].
// GEMM-based ops report FLOP/s (2*m*n*k per GEMM), the cross entropy bytes/s (logits read; bwd: + dlogits written).
// Run: build/bin/demo_step_bench [--benchmark_min_time=0.2]; threads from OMP_NUM_THREADS as in training.
#include <benchmark/benchmark.h>

#include <random>

#include "mcpp/kernels/ops.h"

namespace {
using mcpp::DType;
using mcpp::Tensor;
namespace cpu = mcpp::ops::cpu;

constexpr int64_t kTokens = 1024, kHidden = 128, kVocab = 50304, kSeq = 128, kBatch = 8, kHeads = 4;

Tensor rand_tensor(const mcpp::Shape& shape, uint32_t seed, float scale = 1.0f) {
  Tensor t = Tensor::empty(shape);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = u(gen);
  return t;
}

void set_flops(benchmark::State& st, double flops_per_iter) {
  st.counters["FLOP/s"] = benchmark::Counter(flops_per_iter, benchmark::Counter::kIsIterationInvariantRate);
}

// Args: in, out (n = 1024 tokens). Forward: y = x W^T (+ b).
void BM_DemoLinearFwd(benchmark::State& st) {
  const int64_t in = st.range(0), out = st.range(1);
  const bool bias = out != kVocab;  // the tied LM head has no bias
  Tensor x = rand_tensor({kTokens, in}, 1), w = rand_tensor({out, in}, 2), b = rand_tensor({out}, 3);
  Tensor y = Tensor::empty({kTokens, out});
  for (auto _ : st) {
    cpu::linear_fwd(y, x, w, bias ? &b : nullptr, {});
    benchmark::DoNotOptimize(y.raw());
  }
  set_flops(st, 2.0 * kTokens * in * out);
}
void BM_DemoLinearBwd(benchmark::State& st) {  // dx and dW (+=), db (+=) except for the LM head
  const int64_t in = st.range(0), out = st.range(1);
  const bool bias = out != kVocab;
  Tensor x = rand_tensor({kTokens, in}, 1), w = rand_tensor({out, in}, 2), dy = rand_tensor({kTokens, out}, 3);
  Tensor dx = Tensor::empty({kTokens, in}), dw = Tensor::zeros({out, in}), db = Tensor::zeros({out});
  for (auto _ : st) {
    cpu::linear_bwd(&dx, dw, bias ? &db : nullptr, dy, x, w, mcpp::ops::GradWrite::Accumulate, {});
    benchmark::DoNotOptimize(dx.raw());
  }
  set_flops(st, 4.0 * kTokens * in * out);
}
#define DEMO_LINEARS                                                                                             \
  ->ArgNames({"in", "out"})                                                                                      \
      ->Args({kHidden, kVocab})                                                                                  \
      ->Args({kHidden, 3 * kHidden})                                                                             \
      ->Args({kHidden, kHidden})                                                                                 \
      ->Args({kHidden, 4 * kHidden})                                                                             \
      ->Args({4 * kHidden, kHidden})                                                                             \
      ->Unit(benchmark::kMillisecond)                                                                            \
      ->UseRealTime()
BENCHMARK(BM_DemoLinearFwd) DEMO_LINEARS;
BENCHMARK(BM_DemoLinearBwd) DEMO_LINEARS;

// Arg: 0 = forward (loss, lse), 1 = backward (dlogits in place of the logits, as GPTModel::backward does).
void BM_DemoCrossEntropy(benchmark::State& st) {
  const bool backward = st.range(0) != 0;
  Tensor logits = rand_tensor({kTokens, kVocab}, 1, 4.0f), loss = Tensor::empty({kTokens}),
         lse = Tensor::empty({kTokens});
  Tensor dloss = Tensor::empty({kTokens}), targets = Tensor::empty({kTokens}, DType::I32);
  for (int64_t i = 0; i < kTokens; ++i) targets.data<int32_t>()[i] = static_cast<int32_t>((i * 7919) % kVocab);
  dloss.fill_(1.0f / kTokens);  // mean over tokens
  cpu::cross_entropy_fwd(loss, lse, logits, targets, {});
  Tensor dlogits = Tensor::empty({kTokens, kVocab});
  for (auto _ : st) {
    if (backward) cpu::cross_entropy_bwd(dlogits, dloss, logits, targets, lse, {});
    else cpu::cross_entropy_fwd(loss, lse, logits, targets, {});
  }
  const double bytes = 4.0 * kTokens * kVocab * (backward ? 2.0 : 1.0);
  st.counters["bytes/s"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DemoCrossEntropy)->ArgNames({"bwd"})->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// Arg: 0 = forward, 1 = backward. Causal, q/k/v [s=128, b=8, 4, 32].
void BM_DemoFlashAttention(benchmark::State& st) {
  const bool backward = st.range(0) != 0;
  const int64_t d = kHidden / kHeads;
  Tensor q = rand_tensor({kSeq, kBatch, kHeads, d}, 1), k = rand_tensor({kSeq, kBatch, kHeads, d}, 2),
         v = rand_tensor({kSeq, kBatch, kHeads, d}, 3), dout = rand_tensor({kSeq, kBatch, kHeads, d}, 4);
  Tensor o = Tensor::empty(q.shape()), lse = Tensor::empty({kBatch, kHeads, kSeq});
  Tensor dq = Tensor::empty(q.shape()), dk = Tensor::empty(q.shape()), dv = Tensor::empty(q.shape());
  const mcpp::ops::AttentionOptions opt{.softmax_scale = 0.17677669f, .causal = true};
  cpu::flash_attention_fwd(o, lse, q, k, v, opt, {});
  for (auto _ : st) {
    if (backward) cpu::flash_attention_bwd(dq, dk, dv, dout, q, k, v, o, lse, opt, {});
    else cpu::flash_attention_fwd(o, lse, q, k, v, opt, {});
  }
}
BENCHMARK(BM_DemoFlashAttention)->ArgNames({"bwd"})->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_DemoLayerNorm(benchmark::State& st) {  // forward + backward, [1024, 128]
  const bool backward = st.range(0) != 0;
  Tensor x = rand_tensor({kTokens, kHidden}, 1), g = rand_tensor({kHidden}, 2), b = rand_tensor({kHidden}, 3);
  Tensor dy = rand_tensor({kTokens, kHidden}, 4), y = Tensor::empty({kTokens, kHidden});
  Tensor mean = Tensor::empty({kTokens}), rstd = Tensor::empty({kTokens});
  Tensor dx = Tensor::empty({kTokens, kHidden}), dg = Tensor::zeros({kHidden}), db = Tensor::zeros({kHidden});
  cpu::layernorm_fwd(y, mean, rstd, x, g, &b, 1e-5f, {});
  for (auto _ : st) {
    if (backward) cpu::layernorm_bwd(dx, dg, &db, dy, x, g, mean, rstd, {});
    else cpu::layernorm_fwd(y, mean, rstd, x, g, &b, 1e-5f, {});
  }
}
BENCHMARK(BM_DemoLayerNorm)->ArgNames({"bwd"})->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_DemoGelu(benchmark::State& st) {  // [1024, 512]
  const bool backward = st.range(0) != 0;
  Tensor x = rand_tensor({kTokens, 4 * kHidden}, 1), dy = rand_tensor({kTokens, 4 * kHidden}, 2);
  Tensor y = Tensor::empty(x.shape());
  for (auto _ : st) {
    if (backward) cpu::gelu_bwd(y, dy, x, {});
    else cpu::gelu_fwd(y, x, {});
  }
}
BENCHMARK(BM_DemoGelu)->ArgNames({"bwd"})->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
