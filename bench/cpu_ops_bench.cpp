// Google Benchmark micro-benchmarks of the CPU kernels (ops::cpu) at GPT-2-small-like shapes:
// n = b*s = 1024 tokens, h = 768, ffn 4h, vocab partition 50304. GEMM-based ops report FLOP/s
// (2*m*n*k per GEMM), memory-bound ops report bytes/s (reads + writes of fp32 tensors).
// Run: build/bin/cpu_ops_bench [--benchmark_filter=Linear]. Thread count: OMP_NUM_THREADS /
// OPENBLAS_NUM_THREADS as usual.
#include <benchmark/benchmark.h>

#include <random>

#include "mcpp/kernels/ops.h"

namespace {
using mcpp::Tensor;
namespace cpu = mcpp::ops::cpu;

Tensor rand_tensor(const mcpp::Shape& shape, uint32_t seed) {
  Tensor t = Tensor::empty(shape);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = u(gen);
  return t;
}

void set_flops(benchmark::State& st, double flops_per_iter) {
  st.counters["FLOP/s"] = benchmark::Counter(flops_per_iter, benchmark::Counter::kIsIterationInvariantRate);
}
void set_bytes(benchmark::State& st, double bytes_per_iter) {
  st.SetBytesProcessed(static_cast<int64_t>(bytes_per_iter) * st.iterations());
}

// Args: n (tokens), in, out.
void BM_LinearFwd(benchmark::State& st) {
  const int64_t n = st.range(0), in = st.range(1), out = st.range(2);
  Tensor x = rand_tensor({n, in}, 1), w = rand_tensor({out, in}, 2), b = rand_tensor({out}, 3);
  Tensor y = Tensor::empty({n, out});
  for (auto _ : st) {
    cpu::linear_fwd(y, x, w, &b, {});
    benchmark::DoNotOptimize(y.raw());
  }
  set_flops(st, 2.0 * n * in * out);
}
void BM_LinearBwd(benchmark::State& st) {  // dx, dW (+=), db (+=): two GEMMs
  const int64_t n = st.range(0), in = st.range(1), out = st.range(2);
  Tensor x = rand_tensor({n, in}, 1), w = rand_tensor({out, in}, 2), dy = rand_tensor({n, out}, 3);
  Tensor dx = Tensor::empty({n, in}), dw = Tensor::zeros({out, in}), db = Tensor::zeros({out});
  for (auto _ : st) {
    cpu::linear_bwd(&dx, dw, &db, dy, x, w, mcpp::ops::GradWrite::Accumulate, {});
    benchmark::DoNotOptimize(dx.raw());
  }
  set_flops(st, 4.0 * n * in * out);
}
// QKV (h -> 3h), attention proj (h -> h), fc1 (h -> 4h), fc2 (4h -> h), LM head partition (h -> V).
#define LINEAR_SHAPES                                                                                   \
  ->Args({1024, 768, 2304})->Args({1024, 768, 768})->Args({1024, 768, 3072})->Args({1024, 3072, 768}) \
      ->Args({256, 768, 50304})->Unit(benchmark::kMillisecond)
BENCHMARK(BM_LinearFwd) LINEAR_SHAPES;
BENCHMARK(BM_LinearBwd) LINEAR_SHAPES;

void BM_LayerNormFwd(benchmark::State& st) {
  const int64_t n = st.range(0), h = st.range(1);
  Tensor x = rand_tensor({n, h}, 1), g = rand_tensor({h}, 2), b = rand_tensor({h}, 3);
  Tensor y = Tensor::empty({n, h}), mean = Tensor::empty({n}), rstd = Tensor::empty({n});
  for (auto _ : st) cpu::layernorm_fwd(y, mean, rstd, x, g, &b, 1e-5f, {});
  set_bytes(st, 2.0 * n * h * 4);
}
void BM_LayerNormBwd(benchmark::State& st) {
  const int64_t n = st.range(0), h = st.range(1);
  Tensor x = rand_tensor({n, h}, 1), g = rand_tensor({h}, 2), b = rand_tensor({h}, 3), dy = rand_tensor({n, h}, 4);
  Tensor y = Tensor::empty({n, h}), mean = Tensor::empty({n}), rstd = Tensor::empty({n});
  cpu::layernorm_fwd(y, mean, rstd, x, g, &b, 1e-5f, {});
  Tensor dx = Tensor::empty({n, h}), dg = Tensor::zeros({h}), db = Tensor::zeros({h});
  for (auto _ : st) cpu::layernorm_bwd(dx, dg, &db, dy, x, g, mean, rstd, {});
  set_bytes(st, 5.0 * n * h * 4);  // x, dy read twice (dx pass, param pass), dx written
}
void BM_RMSNormFwd(benchmark::State& st) {
  const int64_t n = st.range(0), h = st.range(1);
  Tensor x = rand_tensor({n, h}, 1), g = rand_tensor({h}, 2);
  Tensor y = Tensor::empty({n, h}), rstd = Tensor::empty({n});
  for (auto _ : st) cpu::rmsnorm_fwd(y, rstd, x, g, 1e-5f, {});
  set_bytes(st, 2.0 * n * h * 4);
}
BENCHMARK(BM_LayerNormFwd)->Args({1024, 768})->Args({4096, 1024})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LayerNormBwd)->Args({1024, 768})->Args({4096, 1024})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RMSNormFwd)->Args({1024, 768})->Args({4096, 1024})->Unit(benchmark::kMicrosecond);

void BM_GeluFwd(benchmark::State& st) {
  const int64_t n = st.range(0);
  Tensor x = rand_tensor({n}, 1), y = Tensor::empty({n});
  for (auto _ : st) cpu::gelu_fwd(y, x, {});
  set_bytes(st, 2.0 * n * 4);
}
void BM_SwigluFwd(benchmark::State& st) {
  const int64_t n = st.range(0), f = st.range(1);
  Tensor x = rand_tensor({n, 2 * f}, 1), y = Tensor::empty({n, f});
  for (auto _ : st) cpu::swiglu_fwd(y, x, {});
  set_bytes(st, 3.0 * n * f * 4);
}
void BM_RopeFwd(benchmark::State& st) {  // [s, b, heads, d] in place
  const int64_t s = st.range(0), b = st.range(1), heads = 12, d = 64;
  Tensor x = rand_tensor({s, b, heads, d}, 1), c = rand_tensor({s, d / 2}, 2), sn = rand_tensor({s, d / 2}, 3);
  for (auto _ : st) cpu::rope_fwd(x, x, c, sn, {});
  set_bytes(st, 2.0 * x.numel() * 4);
}
void BM_DropoutFwd(benchmark::State& st) {
  const int64_t n = st.range(0);
  Tensor x = rand_tensor({n}, 1), y = Tensor::empty({n});
  for (auto _ : st) cpu::dropout_fwd(y, x, 0.1f, mcpp::PhiloxKey{1, 0}, {});
  set_bytes(st, 2.0 * n * 4);
}
BENCHMARK(BM_GeluFwd)->Arg(1024 * 3072)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SwigluFwd)->Args({1024, 2048})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RopeFwd)->Args({1024, 1})->Args({512, 8})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DropoutFwd)->Arg(1024 * 768)->Unit(benchmark::kMicrosecond);

void BM_EmbeddingBwd(benchmark::State& st) {
  const int64_t n = st.range(0), v = 50304, h = 768;
  Tensor ids = Tensor::empty({n}, mcpp::DType::I32);
  for (int64_t i = 0; i < n; ++i) ids.data<int32_t>()[i] = static_cast<int32_t>((i * 7919) % v);
  Tensor dout = rand_tensor({n, h}, 1), dtable = Tensor::zeros({v, h});
  for (auto _ : st) cpu::embedding_bwd(dtable, ids, dout, 0, {});
  set_bytes(st, 3.0 * n * h * 4);
}
BENCHMARK(BM_EmbeddingBwd)->Arg(1024)->Unit(benchmark::kMicrosecond);

void BM_AdamW(benchmark::State& st) {  // 16 bytes read + 12 written per element (+2 for the bf16 copy)
  const int64_t n = st.range(0);
  Tensor p = rand_tensor({n}, 1), m = Tensor::zeros({n}), v = Tensor::zeros({n}), g = rand_tensor({n}, 2);
  Tensor model = Tensor::empty({n}, mcpp::DType::BF16);
  int64_t step = 0;
  for (auto _ : st) cpu::adamw_step(p, m, v, g, &model, mcpp::ops::AdamWOptions{.step = ++step}, {});
  set_bytes(st, 30.0 * n);
}
void BM_SumOfSquares(benchmark::State& st) {
  const int64_t n = st.range(0);
  Tensor x = rand_tensor({n}, 1);
  for (auto _ : st) benchmark::DoNotOptimize(cpu::sum_of_squares(x, {}));
  set_bytes(st, 4.0 * n);
}
BENCHMARK(BM_AdamW)->Arg(1 << 22)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SumOfSquares)->Arg(1 << 22)->Unit(benchmark::kMicrosecond);

}  // namespace
