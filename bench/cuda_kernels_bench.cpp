// cuda_kernels_bench: the kernel table of issue 6 — each CUDA op's achieved TFLOP/s (GEMM, flash
// attention) or GB/s (layernorm, cross entropy) at GPT-2 124M (B32 x T1024, h 768, 12 heads) and
// GPT 1.3B (B8 x T2048, h 2048, 16 heads) shapes, bf16, against the ceilings measured on the H200 here
// (bf16 dense GEMM ~790 TFLOP/s, HBM copy ~4300 GB/s; DESIGN.md "Performance practice").
//
// Timing: `iters` back-to-back launches on the backend compute stream, then one host sync (a 1-element
// device->host copy); host steady clock around the batch, best of `reps` batches, after `warmup`
// launches. Batching makes the sync negligible; no CUDA header is needed, so this file also builds
// (and reports SKIPPED) in a CPU-only build.
// Counting: GEMM 2*m*n*k per product (bwd: dx and dw = 2 products, dw accumulates into fp32);
// attention counts useful causal matmul work — fwd 4*b*nq*s^2*d/2, bwd 2.5x fwd (as bench/attention_bench);
// layernorm bytes = x read + y written (+ dy read, dx written in bwd; mean/rstd/gamma included; the fused
// residual rows add their residual read / sum written; the fp32 dgamma/dbeta partials are not counted);
// cross entropy bytes = logits read (fwd), logits read + dlogits written (bwd); AdamW bytes = 30 per
// parameter (fp32 param, m, v, grad read; param, m, v written; bf16 model copy written).
// Run: build/bin/cuda_kernels_bench [--quick | --attention | --memory-bound | --mlp | --attention-qkv |
// --attention-qkv-cudnn | --attention-dropout | --gemm-survey | --moe-gemm-host]
// (prints a markdown table; --attention: only the attention rows; --memory-bound: only layernorm, cross
// entropy and AdamW; --mlp: only the GELU MLP fusion rows, fused vs unfused; --attention-qkv: only the
// split-vs-packed qkv attention rows, three paths each: the mcpp kernels, cuDNN deterministic, cuDNN
// (--attention-qkv-cudnn: only the two cuDNN ones); --attention-dropout: cuDNN and the mcpp kernels, each
// without and with attention dropout 0.1, at 124M and 1.3B; --gemm-survey: only the cuBLASLt autotuning survey, its
// own table: every training GEMM of the 124M and 1.3B steps with the heuristic's candidates timed by the tuner of
// kernels/cuda/gemm.cpp — median of 5 single-launch cudaEvent timings each — and the one it keeps; --moe-gemm-host:
// the host time of the MoE experts' GEMM calls, cached vs new row counts, against their device time)
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "mcpp/core/device_memory.h"
#include "mcpp/core/error.h"
#include "mcpp/core/tensor.h"
#include "mcpp/kernels/deterministic_kernels.h"
#include "mcpp/kernels/gemm_autotune.h"
#include "mcpp/kernels/ops.h"

namespace {

using mcpp::Device;
using mcpp::DType;
using mcpp::Tensor;

constexpr double kGemmCeilingTflops = 790.0;  // measured 8192^3 bf16 product, KINDS.md
constexpr double kHbmCeilingGbs = 4300.0;     // measured device-to-device copy, KINDS.md

// Device tensor of `dt` with values sin(seed + 0.37 i) * scale.
Tensor filled(const mcpp::Shape& shape, DType dt, float seed, float scale = 1.0f) {
  Tensor t = Tensor::empty(shape);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = scale * std::sin(seed + 0.37f * static_cast<float>(i % 9973));
  return (dt == DType::F32 ? t : t.to(dt)).to(Device::CUDA);
}

void sync_via(const Tensor& t) { (void)t.flat_slice(0, {1}).to(Device::CPU); }

// Seconds per launch: best of `reps` batches of `iters` launches.
double time_op(const std::function<void()>& op, const Tensor& sync_on, int iters, int reps) {
  for (int i = 0; i < 3; ++i) op();
  sync_via(sync_on);
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) op();
    sync_via(sync_on);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters);
  }
  return best;
}

int g_iters = 20, g_reps = 3;

void row(const std::string& kernel, const std::string& shape, double sec, double flops, double bytes) {
  if (flops > 0) {
    double tf = flops / sec / 1e12;
    std::printf("| %s | %s | %.3f | %.1f TFLOP/s | %.0f%% of %.0f |\n", kernel.c_str(), shape.c_str(), sec * 1e3, tf,
                100 * tf / kGemmCeilingTflops, kGemmCeilingTflops);
  } else {
    double gbs = bytes / sec / 1e9;
    std::printf("| %s | %s | %.3f | %.0f GB/s | %.0f%% of %.0f |\n", kernel.c_str(), shape.c_str(), sec * 1e3, gbs,
                100 * gbs / kHbmCeilingGbs, kHbmCeilingGbs);
  }
  std::fflush(stdout);
}

void bench_linear(const char* name, int64_t n, int64_t in, int64_t out) {
  Tensor x = filled({n, in}, DType::BF16, 1.0f), w = filled({out, in}, DType::BF16, 2.0f, 0.02f);
  Tensor y = Tensor::empty({n, out}, DType::BF16, Device::CUDA), dy = filled({n, out}, DType::BF16, 3.0f);
  Tensor dx = Tensor::empty({n, in}, DType::BF16, Device::CUDA);
  Tensor dw = Tensor::zeros({out, in}, DType::F32, Device::CUDA);
  std::string shape = fmt::format("{} [{}x{}] W[{}x{}]", name, n, in, out, in);
  double flops = 2.0 * n * in * out;
  row("linear fwd (bf16 GEMM)", shape, time_op([&] { mcpp::ops::linear_fwd(y, x, w, nullptr); }, y, g_iters, g_reps),
      flops, 0);
  row("linear bwd dx + dw_acc (fp32)", shape,
      time_op([&] { mcpp::ops::linear_bwd(&dx, dw, nullptr, dy, x, w,
                                          mcpp::ops::GradWrite::Accumulate); }, dx, g_iters, g_reps), 2 * flops, 0);
}

std::string fusion_path(const mcpp::ops::EpilogueFusionCounts& a, const mcpp::ops::EpilogueFusionCounts& b) {
  if (b.fwd_fused > a.fwd_fused) return "GELU_AUX epilogue";
  if (b.fwd_fallback > a.fwd_fallback) return "FALLBACK linear_fwd + gelu_fwd";
  if (b.bwd_dgelu_bgrad > a.bwd_dgelu_bgrad) return "DGELU_BGRAD epilogue";
  if (b.bwd_dgelu > a.bwd_dgelu) return "DGELU epilogue";
  if (b.bwd_fallback > a.bwd_fallback) return "FALLBACK gemm + gelu_bwd";
  return "?";
}

// The GELU MLP's fc1 fusion (ops linear_gelu_fwd / linear_dgelu_bwd) against the unfused ops it replaces:
// fwd: x[n,h] W1[f,h]^T + b1 -> gelu, fused vs linear_fwd (bias epilogue) + gelu_fwd;
// bwd: dy[n,h] @ W2[h,f] * gelu'(pre), fused (with fc1's fp32 bias grad, and without) vs gemm + gelu_bwd
// (the unfused path's bias-grad column sum, inside fc1's linear_bwd, is not in the baseline row).
// FLOPs: the GEMM's 2*n*h*f in every row.
void bench_mlp_gelu(const char* name, int64_t n, int64_t h, int64_t f) {
  Tensor x = filled({n, h}, DType::BF16, 1.0f), w1 = filled({f, h}, DType::BF16, 2.0f, 0.02f);
  Tensor b1 = filled({f}, DType::BF16, 5.0f, 0.1f), w2 = filled({h, f}, DType::BF16, 6.0f, 0.02f);
  Tensor pre = Tensor::empty({n, f}, DType::BF16, Device::CUDA), act = Tensor::empty({n, f}, DType::BF16, Device::CUDA);
  Tensor dy = filled({n, h}, DType::BF16, 3.0f), dact = Tensor::empty({n, f}, DType::BF16, Device::CUDA);
  Tensor dpre = Tensor::empty({n, f}, DType::BF16, Device::CUDA), db1 = Tensor::zeros({f}, DType::F32, Device::CUDA);
  const double flops = 2.0 * n * h * f;
  const std::string fshape = fmt::format("{} fc1 x[{}x{}] W[{}x{}]", name, n, h, f, h);
  const std::string bshape = fmt::format("{} dy[{}x{}] W2[{}x{}]", name, n, h, h, f);
  namespace ops = mcpp::ops;
  row("fc1 linear_fwd + gelu_fwd (unfused)", fshape, time_op([&] {
        ops::linear_fwd(pre, x, w1, &b1);
        ops::gelu_fwd(act, pre);
      }, act, g_iters, g_reps), flops, 0);
  auto c0 = ops::cuda_epilogue_fusion_counts();
  const double tf = time_op([&] { ops::linear_gelu_fwd(act, pre, x, w1, &b1); }, act, g_iters, g_reps);
  row("fc1 linear_gelu_fwd: " + fusion_path(c0, ops::cuda_epilogue_fusion_counts()), fshape, tf, flops, 0);
  row("fc2 dgrad gemm + gelu_bwd (unfused)", bshape, time_op([&] {
        ops::gemm(dact, dy, w2, {});
        ops::gelu_bwd(dpre, dact, pre);
      }, dpre, g_iters, g_reps), flops, 0);
  c0 = ops::cuda_epilogue_fusion_counts();
  const double tb = time_op([&] { ops::linear_dgelu_bwd(dpre, &db1, dy, w2, pre); }, dpre, g_iters, g_reps);
  row("fc2 linear_dgelu_bwd + fc1 db: " + fusion_path(c0, ops::cuda_epilogue_fusion_counts()), bshape, tb, flops, 0);
  c0 = ops::cuda_epilogue_fusion_counts();
  const double tn = time_op([&] { ops::linear_dgelu_bwd(dpre, nullptr, dy, w2, pre); }, dpre, g_iters, g_reps);
  row("fc2 linear_dgelu_bwd, no db: " + fusion_path(c0, ops::cuda_epilogue_fusion_counts()), bshape, tn, flops, 0);
}

void bench_gemm_square(int64_t m) {
  Tensor a = filled({m, m}, DType::BF16, 1.0f), b = filled({m, m}, DType::BF16, 2.0f);
  Tensor c = Tensor::empty({m, m}, DType::BF16, Device::CUDA);
  row("gemm bf16 (ceiling shape)", fmt::format("{}^3", m),
      time_op([&] { mcpp::ops::gemm(c, a, b, {}); }, c, g_iters, g_reps), 2.0 * m * m * m, 0);
}

void bench_layernorm(const char* name, int64_t n, int64_t h) {
  Tensor x = filled({n, h}, DType::BF16, 1.0f), dy = filled({n, h}, DType::BF16, 2.0f);
  Tensor gamma = filled({h}, DType::F32, 3.0f), beta = filled({h}, DType::F32, 4.0f);
  Tensor y = Tensor::empty({n, h}, DType::BF16, Device::CUDA), dx = Tensor::empty({n, h}, DType::BF16, Device::CUDA);
  Tensor mean = Tensor::empty({n}, DType::F32, Device::CUDA), rstd = Tensor::empty({n}, DType::F32, Device::CUDA);
  Tensor dg = Tensor::zeros({h}, DType::F32, Device::CUDA), db = Tensor::zeros({h}, DType::F32, Device::CUDA);
  std::string shape = fmt::format("{} [{}x{}]", name, n, h);
  double io = 2.0 * n * h, stats = 8.0 * n;
  // The ceiling at this size: a device-to-device copy of x (read + write, as many bytes as the fwd).
  row("copy of x (cudaMemcpy D2D, reference)", shape, time_op([&] { y.copy_from(x); }, y, g_iters, g_reps), 0,
      2 * io);
  row("layernorm fwd (bf16 I/O)", shape,
      time_op([&] { mcpp::ops::layernorm_fwd(y, mean, rstd, x, gamma, &beta, 1e-5f); }, y, g_iters, g_reps), 0,
      2 * io + stats);
  row("layernorm bwd (bf16 I/O)", shape,
      time_op([&] { mcpp::ops::layernorm_bwd(dx, dg, &db, dy, x, gamma, mean, rstd); }, dx, g_iters, g_reps), 0,
      3 * io + stats);
  // The transformer layer's residual pattern: fused (one kernel) vs unfused (add, then the norm; the norm's
  // bwd, then add_inplace). Bytes: what each variant moves (fused fwd: a, b read, sum, y written; fused bwd:
  // x, dy, dres read, dx written; unfused: plus the intermediate's write and re-read).
  Tensor b = filled({n, h}, DType::BF16, 5.0f), sum = Tensor::empty({n, h}, DType::BF16, Device::CUDA);
  row("add + layernorm fwd, fused (bf16 I/O)", shape,
      time_op([&] { mcpp::ops::add_layernorm_fwd(sum, y, mean, rstd, x, b, gamma, &beta, 1e-5f, {}); }, y, g_iters,
              g_reps),
      0, 4 * io + stats);
  row("add, then layernorm fwd (unfused)", shape, time_op([&] {
        mcpp::ops::add(sum, x, b);
        mcpp::ops::layernorm_fwd(y, mean, rstd, sum, gamma, &beta, 1e-5f);
      }, y, g_iters, g_reps),
      0, 5 * io + stats);
  row("layernorm bwd + dres, fused (bf16 I/O)", shape, time_op([&] {
        mcpp::ops::add_layernorm_bwd(dx, dg, &db, dy, b, x, gamma, mean, rstd, nullptr, nullptr, {}, nullptr);
      }, dx, g_iters, g_reps),
      0, 4 * io + stats);
  // + the residual bias sums (fc2's and linear_proj's bias grads: column sums of dres and of dx), read as
  // 2 h floats more written; the alternative is two column-sum passes over dres and dx (2 x io read).
  Tensor sr = Tensor::zeros({h}, DType::F32, Device::CUDA), sd = Tensor::zeros({h}, DType::F32, Device::CUDA);
  row("layernorm bwd + dres + residual bias sums, fused", shape, time_op([&] {
        mcpp::ops::add_layernorm_bwd(dx, dg, &db, dy, b, x, gamma, mean, rstd, &sr, &sd, {}, nullptr);
      }, dx, g_iters, g_reps),
      0, 4 * io + stats);
  row("layernorm bwd, then add_inplace (unfused)", shape, time_op([&] {
        mcpp::ops::layernorm_bwd(dx, dg, &db, dy, x, gamma, mean, rstd);
        mcpp::ops::add_inplace(dx, b);
      }, dx, g_iters, g_reps),
      0, 6 * io + stats);
  // Hidden dropout on the branch (Megatron's bias-dropout-add, p 0.1): inside the norm kernels (fwd: b dropped
  // in registers; bwd: dbranch written beside dx, the branch's bias sum over it) vs a dropout pass before the
  // fused forward and a dropout_bwd pass after the fused backward (the path before session 11).
  const mcpp::ops::ResidualDropout drop{0.1f, mcpp::PhiloxKey{.seed = 7, .offset = 0}};
  Tensor dropped = Tensor::empty({n, h}, DType::BF16, Device::CUDA);
  Tensor dbr = Tensor::empty({n, h}, DType::BF16, Device::CUDA);
  row("add + layernorm fwd + residual dropout, fused", shape,
      time_op([&] { mcpp::ops::add_layernorm_fwd(sum, y, mean, rstd, x, b, gamma, &beta, 1e-5f, drop); }, y, g_iters,
              g_reps),
      0, 4 * io + stats);
  row("dropout, then add + layernorm fwd (2 kernels)", shape, time_op([&] {
        mcpp::ops::dropout_fwd(dropped, b, drop.p, drop.key);
        mcpp::ops::add_layernorm_fwd(sum, y, mean, rstd, x, dropped, gamma, &beta, 1e-5f, {});
      }, y, g_iters, g_reps),
      0, 6 * io + stats);
  row("layernorm bwd + dres + dropout bwd + branch bias sum, fused", shape, time_op([&] {
        mcpp::ops::add_layernorm_bwd(dx, dg, &db, dy, b, x, gamma, mean, rstd, nullptr, &sd, drop, &dbr);
      }, dx, g_iters, g_reps),
      0, 5 * io + stats);
  row("layernorm bwd + dres, then dropout bwd (2 kernels)", shape, time_op([&] {
        mcpp::ops::add_layernorm_bwd(dx, dg, &db, dy, b, x, gamma, mean, rstd, nullptr, nullptr, {}, nullptr);
        mcpp::ops::dropout_bwd(dbr, dx, drop.p, drop.key);
      }, dx, g_iters, g_reps),
      0, 6 * io + stats);
}

void bench_cross_entropy(const char* name, int64_t n, int64_t v) {
  Tensor logits = filled({n, v}, DType::BF16, 1.0f, 3.0f);
  Tensor th = Tensor::empty({n}, DType::I32);
  for (int64_t i = 0; i < n; ++i) th.data<int32_t>()[i] = static_cast<int32_t>((i * 7919) % v);
  Tensor targets = th.to(Device::CUDA);
  Tensor loss = Tensor::empty({n}, DType::F32, Device::CUDA), lse = Tensor::empty({n}, DType::F32, Device::CUDA);
  Tensor dloss = filled({n}, DType::F32, 2.0f);
  Tensor dlogits = Tensor::empty({n, v}, DType::BF16, Device::CUDA);
  std::string shape = fmt::format("{} [{}x{}]", name, n, v);
  double bytes = 2.0 * n * v;
  row("cross entropy fwd (bf16 logits)", shape,
      time_op([&] { mcpp::ops::cross_entropy_fwd(loss, lse, logits, targets); }, loss, g_iters, g_reps), 0, bytes);
  row("cross entropy bwd (bf16 logits)", shape,
      time_op([&] { mcpp::ops::cross_entropy_bwd(dlogits, dloss, logits, targets, lse); }, dlogits, g_iters, g_reps), 0,
      2 * bytes);
  row("cross entropy fwd+bwd fused (bf16 logits)", shape,
      time_op([&] { mcpp::ops::cross_entropy_fwd_bwd(loss, lse, dlogits, logits, targets, dloss); }, dlogits, g_iters,
              g_reps),
      0, 2 * bytes);
  // The vocab-parallel pieces on one tp = 2 shard [n, v / 2]: the 16-byte vector path, and the scalar path
  // it replaced (the shard one column wider, v / 2 + 1: not a multiple of 8).
  for (int64_t vs : {v / 2, v / 2 + 1}) {
    Tensor shard = filled({n, vs}, DType::BF16, 1.0f, 3.0f), dshard = Tensor::empty({n, vs}, DType::BF16, Device::CUDA);
    Tensor mx = Tensor::empty({n}, DType::F32, Device::CUDA), se = Tensor::empty({n}, DType::F32, Device::CUDA);
    const std::string sh = fmt::format("{} tp2 shard [{}x{}]{}", name, n, vs, vs % 8 ? " (scalar path)" : "");
    const double b = 2.0 * n * vs;
    row("vocab-parallel CE partials (bf16 logits)", sh,
        time_op([&] { mcpp::ops::vocab_parallel_ce_partials(mx, se, loss, shard, targets, 0); }, mx, g_iters, g_reps),
        0, b);
    row("vocab-parallel CE bwd (bf16 logits)", sh,
        time_op([&] { mcpp::ops::vocab_parallel_ce_bwd(dshard, dloss, shard, targets, lse, 0); }, dshard, g_iters,
                g_reps),
        0, 2 * b);
  }
}

// Embedding backward (fp32 main grad += bf16 dout rows), the default atomicAdd kernel vs the ordered one
// of --deterministic-mode. Bytes = dout read + the touched grad rows read and written (upper bound n rows).
void bench_embedding_bwd(const char* name, int64_t n, int64_t v, int64_t h) {
  Tensor ih = Tensor::empty({n}, DType::I32);
  for (int64_t i = 0; i < n; ++i) ih.data<int32_t>()[i] = static_cast<int32_t>((i * 7919) % v);
  Tensor ids = ih.to(Device::CUDA), dout = filled({n, h}, DType::BF16, 0.5f);
  Tensor grad = Tensor::zeros({v, h}, DType::F32, Device::CUDA);
  const std::string shape = fmt::format("{} ids [{}] -> [{}x{}]", name, n, v, h);
  const double bytes = 2.0 * n * h + 8.0 * std::min(n, v) * h;
  for (bool ordered : {false, true}) {
    mcpp::ops::cuda::set_deterministic_kernels(ordered);
    row(ordered ? "embedding bwd, ordered (deterministic)" : "embedding bwd, atomicAdd", shape,
        time_op([&] { mcpp::ops::embedding_bwd(grad, ids, dout, 0); }, grad, g_iters, g_reps), 0, bytes);
  }
  mcpp::ops::cuda::set_deterministic_kernels(false);
}

// AdamW over GPT-2 124M's 148 parameter tensors (fp32 master, m, v, grad; bf16 model copy): the
// per-parameter adamw_step loop vs one adamw_multi_step. Bytes = 4 fp32 reads + 3 fp32 writes + 1 bf16 write.
void bench_adamw() {
  std::vector<int64_t> sizes{50304 * 768, 1024 * 768, 768, 768};
  for (int l = 0; l < 12; ++l)
    for (int64_t n : {768LL, 768LL, 2304LL * 768, 2304LL, 768LL * 768, 768LL, 768LL, 768LL, 3072LL * 768, 3072LL,
                      768LL * 3072, 768LL})
      sizes.push_back(n);
  std::vector<mcpp::ops::AdamWTensors> list;
  int64_t total = 0;
  for (int64_t n : sizes) {
    list.push_back(mcpp::ops::AdamWTensors{.param = filled({n}, DType::F32, 1.0f),
                                           .exp_avg = Tensor::zeros({n}, DType::F32, Device::CUDA),
                                           .exp_avg_sq = Tensor::zeros({n}, DType::F32, Device::CUDA),
                                           .grad = filled({n}, DType::F32, 2.0f, 1e-3f),
                                           .param_model = Tensor::empty({n}, DType::BF16, Device::CUDA),
                                           .weight_decay = 0.1f});
    total += n;
  }
  const mcpp::ops::AdamWOptions opt{.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = 10};
  const std::string shape = fmt::format("124M: {} tensors, {} params", list.size(), total);
  const double bytes = 30.0 * total;
  row("adamw_step x148 (per parameter)", shape, time_op([&] {
        for (auto& e : list) mcpp::ops::adamw_step(e.param, e.exp_avg, e.exp_avg_sq, e.grad, &e.param_model, opt);
      }, list[0].param, g_iters, g_reps), 0, bytes);
  row("adamw_multi_step (multi-tensor)", shape,
      time_op([&] { mcpp::ops::adamw_multi_step(list, opt); }, list[0].param, g_iters, g_reps), 0, bytes);
}

// The grad norm's reduction (sum_of_squares, float64 accumulation) over a whole fp32 grad buffer, as
// model_grad_norm runs it at tp 1: 124M and 1.3B parameters. Bytes = 4 per element read.
void bench_grad_norm() {
  for (const auto& [name, n] : {std::pair<const char*, int64_t>{"124M", 124'475'904},
                                std::pair<const char*, int64_t>{"1.3B", 1'313'722'368}}) {
    Tensor g = filled({n}, DType::F32, 3.0f, 1e-3f);
    double sink = 0.0;
    row("sum_of_squares (grad norm)", fmt::format("{} fp32 grads [{}]", name, n),
        time_op([&] { sink += mcpp::ops::sum_of_squares(g); }, g, g_iters, g_reps), 0, 4.0 * n);
    if (sink < 0) std::printf("impossible\n");
  }
}

// Which attention the rows run: cuDNN's fused attention (default), its deterministic backward
// (--deterministic-mode), the mcpp tensor-core kernels (ops::cuda::set_cudnn_attention(false)), or either with
// attention dropout 0.1 (cuDNN's RNG node; the mcpp kernels' in-tile Philox mask, the CPU's).
enum class AttnPath { Cudnn, CudnnDeterministic, Mcpp, CudnnDropout, McppDropout };
const char* path_label(AttnPath p) {
  switch (p) {
    case AttnPath::Cudnn: return " (default: cuDNN)";
    case AttnPath::CudnnDeterministic: return " (deterministic: cuDNN)";
    case AttnPath::Mcpp: return " (mcpp kernels)";
    case AttnPath::CudnnDropout: return " (default: cuDNN, dropout 0.1)";
    case AttnPath::McppDropout: return " (mcpp kernels, dropout 0.1)";
  }
  return "";
}
struct AttnPathScope {  // sets the process-wide cuDNN switch for one bench row group
  explicit AttnPathScope(AttnPath p) : prev(mcpp::ops::cuda::cudnn_attention()) {
    mcpp::ops::cuda::set_cudnn_attention(p != AttnPath::Mcpp && p != AttnPath::McppDropout);
  }
  ~AttnPathScope() { mcpp::ops::cuda::set_cudnn_attention(prev); }
  bool prev;
};

// ng < nq: GQA (ng kv groups).
void bench_attention(const char* name, int64_t s, int64_t b, int64_t nq, int64_t d, int64_t ng = 0,
                     AttnPath path = AttnPath::Cudnn) {
  if (ng == 0) ng = nq;
  const AttnPathScope scope(path);
  Tensor q = filled({s, b, nq, d}, DType::BF16, 1.0f), k = filled({s, b, ng, d}, DType::BF16, 2.0f);
  Tensor v = filled({s, b, ng, d}, DType::BF16, 3.0f), dout = filled({s, b, nq, d}, DType::BF16, 4.0f);
  Tensor o = Tensor::empty({s, b, nq, d}, DType::BF16, Device::CUDA), lse = Tensor::empty({b, nq, s}, DType::F32, Device::CUDA);
  Tensor dq = Tensor::empty({s, b, nq, d}, DType::BF16, Device::CUDA);
  Tensor dk = Tensor::empty({s, b, ng, d}, DType::BF16, Device::CUDA);
  Tensor dv = Tensor::empty({s, b, ng, d}, DType::BF16, Device::CUDA);
  mcpp::ops::AttentionOptions opt{.softmax_scale = 1.0f / std::sqrt(static_cast<float>(d)),
                                  .causal = true,
                                  .deterministic = path == AttnPath::CudnnDeterministic,
                                  .dropout_p = path == AttnPath::McppDropout || path == AttnPath::CudnnDropout ? 0.1f
                                                                                                            : 0.0f,
                                  .dropout_key = {.seed = 1, .offset = 0}};
  std::string shape = ng == nq ? fmt::format("{} s{} b{} h{} d{} causal", name, s, b, nq, d)
                               : fmt::format("{} s{} b{} h{} g{} d{} causal", name, s, b, nq, ng, d);
  const std::string how = path_label(path);
  double fwd = 4.0 * b * nq * s * s * d / 2;
  int it = std::max(2, g_iters / 5);
  row("flash attention fwd" + how, shape,
      time_op([&] { mcpp::ops::flash_attention_fwd(o, lse, q, k, v, opt); }, o, it, g_reps), fwd, 0);
  row("flash attention bwd" + how, shape,
      time_op([&] { mcpp::ops::flash_attention_bwd(dq, dk, dv, dout, q, k, v, o, lse, opt); }, dq, it, g_reps),
      2.5 * fwd, 0);
}

// Megatron's fused qkv [s, b, ng (r + 2) d] (MHA here: r = 1) into attention: the split path (qkv_split
// copy + attention; attention bwd + qkv_merge copy) against the packed ops reading / writing the fused rows
// in place. Same attention FLOPs; the difference is the two copies. Each attention path (AttnPath).
void bench_attention_qkv(const char* name, int64_t s, int64_t b, int64_t nq, int64_t d, AttnPath path) {
  const int64_t ng = nq;
  const AttnPathScope scope(path);
  auto dev = [](const mcpp::Shape& sh, DType dt) { return Tensor::empty(sh, dt, Device::CUDA); };
  Tensor qkv = filled({s, b, (nq + 2 * ng) * d}, DType::BF16, 1.0f), dout = filled({s, b, nq, d}, DType::BF16, 4.0f);
  Tensor q = dev({s, b, nq, d}, DType::BF16), k = dev({s, b, ng, d}, DType::BF16), v = dev({s, b, ng, d}, DType::BF16);
  Tensor dq = dev({s, b, nq, d}, DType::BF16), dk = dev({s, b, ng, d}, DType::BF16);
  Tensor dv = dev({s, b, ng, d}, DType::BF16);
  Tensor o = dev({s, b, nq, d}, DType::BF16), lse = dev({b, nq, s}, DType::F32), dqkv = dev(qkv.shape(), DType::BF16);
  mcpp::ops::AttentionOptions opt{.softmax_scale = 1.0f / std::sqrt(static_cast<float>(d)),
                                  .causal = true,
                                  .deterministic = path == AttnPath::CudnnDeterministic};
  std::string shape = fmt::format("{} s{} b{} h{} d{} causal", name, s, b, nq, d);
  const std::string how = path_label(path);
  double fwd = 4.0 * b * nq * s * s * d / 2;
  int it = std::max(2, g_iters / 5);
  row("qkv_split + flash attention fwd" + how, shape, time_op([&] {
        mcpp::ops::qkv_split(q, k, v, qkv);
        mcpp::ops::flash_attention_fwd(o, lse, q, k, v, opt);
      }, o, it, g_reps), fwd, 0);
  row("flash attention fwd, packed qkv" + how, shape,
      time_op([&] { mcpp::ops::flash_attention_fwd_qkv(o, lse, qkv, ng, opt); }, o, it, g_reps), fwd, 0);
  mcpp::ops::qkv_split(q, k, v, qkv);
  row("flash attention bwd + qkv_merge" + how, shape, time_op([&] {
        mcpp::ops::flash_attention_bwd(dq, dk, dv, dout, q, k, v, o, lse, opt);
        mcpp::ops::qkv_merge(dqkv, dq, dk, dv);
      }, dqkv, it, g_reps), 2.5 * fwd, 0);
  row("flash attention bwd, packed qkv" + how, shape,
      time_op([&] { mcpp::ops::flash_attention_bwd_qkv(dqkv, dout, qkv, o, lse, ng, opt); }, dqkv, it, g_reps),
      2.5 * fwd, 0);
}

void bench_attention_qkv_all() {
  for (AttnPath path : {AttnPath::Mcpp, AttnPath::CudnnDeterministic, AttnPath::Cudnn}) {
    bench_attention_qkv("124M", 1024, 32, 12, 64, path);
    bench_attention_qkv("1.3B", 2048, 8, 16, 128, path);
  }
}

// ---- cuBLASLt algorithm survey (kernels/gemm_autotune.h). Each op runs once with every plan untuned, so
// the tuner times each GEMM's heuristic candidates on the op's own operands; one row per GEMM of the op.
struct SurveyTotals {
  double ms0 = 0.0, ms_kept = 0.0;  // per step: sum of times_per_step x (#0 | kept) ms
};

// tot == nullptr: an alternative formulation shown for comparison, not summed into the step.
void survey_op(const std::string& label, int64_t per_step, const std::function<void()>& op, SurveyTotals* tot) {
  namespace tune = mcpp::ops::cuda;
  tune::reset_gemm_tuning();
  op();
  for (const tune::GemmTuneRecord& r : tune::gemm_tune_records()) {
    if (r.candidate_ms.empty()) {
      std::printf("| %s | %s | (not timed: %s) | | | | #0 | | |\n", label.c_str(), r.gemm.c_str(), r.note.c_str());
      continue;
    }
    std::string cands;
    int best = 0;
    for (size_t i = 0; i < r.candidate_ms.size(); ++i) {
      cands += fmt::format("{}{:.3f}", i ? " " : "", r.candidate_ms[i]);
      if (r.candidate_ms[i] < r.candidate_ms[best]) best = static_cast<int>(i);
    }
    const double t0 = r.candidate_ms[0], tb = r.candidate_ms[best], tk = r.candidate_ms[r.chosen];
    std::printf("| %s | %s | %s | %.3f | %.3f (#%d) | %.3fx | #%d | %.0f TFLOP/s | %s / %s |\n", label.c_str(),
                r.gemm.c_str(), cands.c_str(), t0, tb, best, t0 / tb, r.chosen,
                2.0 * r.m * r.n * r.k / (tk * 1e-3) / 1e12, r.candidate_config[0].c_str(),
                r.candidate_config[best].c_str());
    if (tot) {
      tot->ms0 += per_step * t0;
      tot->ms_kept += per_step * tk;
    }
  }
  std::fflush(stdout);
}

// The training GEMMs of one GPT step (n tokens, hidden d, ffn 4d, L layers, tied LM head over V), bf16
// activations and weights, fp32 main grads (wgrad: beta = 0; the beta = 1 rows after), biases on, as
// TransformerLayer / MLP / GPTModel call them: qkv, proj, fc2 fwd with the BIAS epilogue; fc1 fwd
// GELU_AUX_BIAS; fc2 dgrad DGELU (no bias grad: fc1's rides in its wgrad); dgrad + BGRADB wgrad for qkv,
// proj, fc1; fc2 wgrad only; LM head fwd, dgrad and plain wgrad.
void survey_model(const char* name, int64_t n, int64_t d, int64_t layers, int64_t vocab) {
  namespace ops = mcpp::ops;
  const int64_t f = 4 * d;
  auto w = [](const mcpp::Shape& sh, float seed) { return filled(sh, DType::BF16, seed, 0.02f); };
  auto out = [](const mcpp::Shape& sh) { return Tensor::empty(sh, DType::BF16, Device::CUDA); };
  auto grad = [](const mcpp::Shape& sh) { return Tensor::zeros(sh, DType::F32, Device::CUDA); };
  Tensor x = filled({n, d}, DType::BF16, 1.0f), dyd = filled({n, d}, DType::BF16, 2.0f);  // [n, d]
  Tensor dyqkv = filled({n, 3 * d}, DType::BF16, 3.0f), dpre = filled({n, f}, DType::BF16, 4.0f);
  Tensor wqkv = w({3 * d, d}, 5.0f), wproj = w({d, d}, 6.0f), w1 = w({f, d}, 7.0f), w2 = w({d, f}, 8.0f);
  Tensor emb = w({vocab, d}, 9.0f);
  Tensor bqkv = w({3 * d}, 10.0f), bproj = w({d}, 11.0f), b1 = w({f}, 12.0f), b2 = w({d}, 13.0f);
  Tensor dwqkv = grad({3 * d, d}), dwproj = grad({d, d}), dw1 = grad({f, d}), dw2 = grad({d, f});
  Tensor demb = grad({vocab, d}), dbqkv = grad({3 * d}), dbproj = grad({d}), db1 = grad({f}), db2 = grad({d});
  Tensor yqkv = out({n, 3 * d}), yd = out({n, d}), dx = out({n, d}), act = out({n, f}), pre = out({n, f});
  Tensor dpre_out = out({n, f});
  ops::linear_gelu_fwd(act, pre, x, w1, &b1);  // act / pre with GELU-shaped values for the fc2 rows
  SurveyTotals tot;
  const std::string m = name;
  // The wgrads as one microbatch's step runs them (GradWrite::Overwrite: beta = 0 into the stale main grads,
  // counted in the step totals); then the same with += (beta = 1: later microbatches), not counted.
  const ops::GradWrite ow = ops::GradWrite::Overwrite, acc = ops::GradWrite::Accumulate;
  auto bwd_rows = [&](const std::string& suffix, ops::GradWrite gw, SurveyTotals* t) {
    survey_op(m + " qkv bwd" + suffix, layers, [&] { ops::linear_bwd(&dx, dwqkv, &dbqkv, dyqkv, x, wqkv, gw); }, t);
    survey_op(m + " proj bwd" + suffix, layers, [&] { ops::linear_bwd(&dx, dwproj, &dbproj, dyd, x, wproj, gw); }, t);
    survey_op(m + " fc1 bwd" + suffix, layers, [&] { ops::linear_bwd(&dx, dw1, &db1, dpre, x, w1, gw); }, t);
    survey_op(m + " fc2 wgrad" + suffix, layers, [&] { ops::linear_bwd(nullptr, dw2, &db2, dyd, act, w2, gw); }, t);
  };
  survey_op(m + " qkv fwd", layers, [&] { ops::linear_fwd(yqkv, x, wqkv, &bqkv); }, &tot);
  survey_op(m + " proj fwd", layers, [&] { ops::linear_fwd(yd, x, wproj, &bproj); }, &tot);
  survey_op(m + " fc1 fwd", layers, [&] { ops::linear_gelu_fwd(act, pre, x, w1, &b1); }, &tot);
  survey_op(m + " fc2 fwd", layers, [&] { ops::linear_fwd(yd, act, w2, &b2); }, &tot);
  survey_op(m + " fc2 dgrad", layers, [&] { ops::linear_dgelu_bwd(dpre_out, nullptr, dyd, w2, pre); }, &tot);
  bwd_rows("", ow, &tot);
  {
    Tensor logits = out({n, vocab});  // [n, V]; its values serve as dlogits (in place, as GPTModel)
    survey_op(m + " lm head fwd", 1, [&] { ops::linear_fwd(logits, x, emb, nullptr); }, &tot);
    survey_op(m + " lm head bwd", 1, [&] { ops::linear_bwd(&dx, demb, nullptr, logits, x, emb, ow); }, &tot);
  }
  bwd_rows(" (+=)", acc, nullptr);
  std::printf("| %s step: %lld layers x (the layer rows) + LM head | | | %.2f | %.2f (kept) | %.3fx | | |\n", name,
              static_cast<long long>(layers), tot.ms0, tot.ms_kept, tot.ms0 / tot.ms_kept);
  std::fflush(stdout);
}

void bench_gemm_survey() {
  mcpp::ops::cuda::set_gemm_autotune(true);
  std::printf("\n| op (GEMMs) | GEMM: C[m,n] = op(a) op(b), dtypes, beta, epilogue | candidates ms (heuristic order) |"
              " #0 ms | best ms | best vs #0 | kept | kept rate | config #0 / best |\n"
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  survey_model("124M", 32768, 768, 12, 50304);
  survey_model("1.3B", 16384, 2048, 24, 50304);
}

// Host cost of the MoE experts' GEMM calls (GPT-2 124M shapes: h 768, ffn 3072, GELU MLP, ~2048 rows an expert):
// microseconds of host time per op call (the enqueue: checks, the plan lookup or creation, the launch; no sync),
// for a row count seen before (a cached plan) and for a new row count every call (past the family's tuned
// shapes: a plan borrowed through cublasLtMatmulAlgoCheck), against the call's device time.
void bench_moe_gemm_host() {
  namespace ops = mcpp::ops;
  const int64_t h = 768, f = 3072, rows_max = 4096;
  auto w = [](const mcpp::Shape& sh, float seed) { return filled(sh, DType::BF16, seed, 0.02f); };
  Tensor x = filled({rows_max, h}, DType::BF16, 1.0f), dy = filled({rows_max, h}, DType::BF16, 2.0f);
  Tensor w1 = w({f, h}, 3.0f), w2 = w({h, f}, 4.0f), b1 = w({f}, 5.0f), b2 = w({h}, 6.0f);
  Tensor act = Tensor::empty({rows_max, f}, DType::BF16, Device::CUDA), pre = act.clone();
  Tensor dpre = act.clone(), y = Tensor::empty({rows_max, h}, DType::BF16, Device::CUDA), dx = y.clone();
  Tensor dw1 = Tensor::zeros({f, h}, DType::F32, Device::CUDA), dw2 = Tensor::zeros({h, f}, DType::F32, Device::CUDA);
  Tensor db1 = Tensor::zeros({f}, DType::F32, Device::CUDA), db2 = Tensor::zeros({h}, DType::F32, Device::CUDA);
  struct Op {
    const char* name;
    std::function<void(int64_t)> run;  // at r rows
  };
  const std::vector<Op> list = {
      {"fc1 fwd (GELU_AUX_BIAS)", [&](int64_t r) {
         Tensor a = act.narrow0(0, r), p = pre.narrow0(0, r);
         ops::linear_gelu_fwd(a, p, x.narrow0(0, r), w1, &b1);
       }},
      {"fc2 fwd (BIAS)", [&](int64_t r) { Tensor o = y.narrow0(0, r); ops::linear_fwd(o, act.narrow0(0, r), w2, &b2); }},
      {"fc2 dgrad (DGELU)", [&](int64_t r) {
         Tensor d = dpre.narrow0(0, r);
         ops::linear_dgelu_bwd(d, nullptr, dy.narrow0(0, r), w2, pre.narrow0(0, r));
       }},
      {"fc2 wgrad (+= fp32)", [&](int64_t r) {
         ops::linear_bwd(nullptr, dw2, &db2, dy.narrow0(0, r), act.narrow0(0, r), w2, ops::GradWrite::Accumulate);
       }},
      {"fc1 dgrad + wgrad (+= fp32, BGRADB)", [&](int64_t r) {
         Tensor d = dx.narrow0(0, r);
         ops::linear_bwd(&d, dw1, &db1, dpre.narrow0(0, r), x.narrow0(0, r), w1, ops::GradWrite::Accumulate);
       }},
  };
  std::printf("\n| MoE expert GEMM (h 768, ffn 3072) | host us / call, cached shape | host us / call, new row count |"
              " device us / call (2048 rows) |\n| --- | --- | --- | --- |\n");
  int64_t fresh = 1000;  // row counts never used before: 1000, 1001, ...
  for (const Op& op : list) {
    for (int i = 0; i < 20; ++i) op.run(fresh++);  // past the family's autotuned shapes
    op.run(2048);
    sync_via(x);
    auto host_us = [&](const std::function<int64_t(int)>& rows) {
      double best = 1e30;
      for (int rep = 0; rep < 3; ++rep) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 50; ++i) op.run(rows(i));
        const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
        sync_via(x);
        best = std::min(best, us / 50);
      }
      return best;
    };
    const double cached = host_us([](int) { return int64_t{2048}; });
    const double fresh_us = host_us([&](int) { return fresh++; });
    const double dev = time_op([&] { op.run(2048); }, x, 50, 3) * 1e6;
    std::printf("| %s | %.1f | %.1f | %.1f |\n", op.name, cached, fresh_us, dev);
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  bool attention_only = argc > 1 && std::strcmp(argv[1], "--attention") == 0;
  bool memory_only = argc > 1 && std::strcmp(argv[1], "--memory-bound") == 0;
  bool mlp_only = argc > 1 && std::strcmp(argv[1], "--mlp") == 0;
  bool qkv_only = argc > 1 && std::strcmp(argv[1], "--attention-qkv") == 0;
  bool survey_only = argc > 1 && std::strcmp(argv[1], "--gemm-survey") == 0;
  bool moe_host_only = argc > 1 && std::strcmp(argv[1], "--moe-gemm-host") == 0;
  bool qkv_cudnn_only = argc > 1 && std::strcmp(argv[1], "--attention-qkv-cudnn") == 0;
  bool dropout_only = argc > 1 && std::strcmp(argv[1], "--attention-dropout") == 0;
  if (quick) g_iters = 3, g_reps = 1;
  if (!mcpp::cuda_available()) {
    std::printf("SKIPPED: no CUDA device (or built without CUDA)\n");
    return 0;
  }
  try {
    if (moe_host_only) {
      bench_moe_gemm_host();
      return 0;
    }
    if (survey_only) {
      bench_gemm_survey();
      return 0;
    }
    std::printf("| kernel | shape | ms | achieved | vs ceiling |\n| --- | --- | --- | --- | --- |\n");
    if (memory_only) {
      bench_layernorm("124M", 32768, 768);
      bench_layernorm("1.3B", 16384, 2048);
      bench_cross_entropy("124M B8 T1024", 8192, 50304);
      bench_cross_entropy("124M B32 T1024", 32768, 50304);
      bench_embedding_bwd("124M word", 32768, 50304, 768);
      bench_embedding_bwd("124M position", 32768, 1024, 768);
      bench_adamw();
      bench_grad_norm();
      return 0;
    }
    if (mlp_only) {
      bench_mlp_gelu("124M", 32768, 768, 3072);
      bench_mlp_gelu("1.3B", 16384, 2048, 8192);
      return 0;
    }
    if (qkv_cudnn_only) {
      for (AttnPath path : {AttnPath::Cudnn, AttnPath::CudnnDeterministic}) {
        bench_attention_qkv("124M", 1024, 32, 12, 64, path);
        bench_attention_qkv("1.3B", 2048, 8, 16, 128, path);
      }
      return 0;
    }
    if (qkv_only) {
      bench_attention_qkv_all();
      return 0;
    }
    if (dropout_only) {
      for (AttnPath path : {AttnPath::Cudnn, AttnPath::CudnnDropout, AttnPath::Mcpp, AttnPath::McppDropout}) {
        bench_attention("124M", 1024, 32, 12, 64, 0, path);
        bench_attention("1.3B", 2048, 8, 16, 128, 0, path);
      }
      return 0;
    }
    if (!attention_only) {
      bench_gemm_square(8192);
      bench_linear("124M qkv", 32768, 768, 2304);
      bench_linear("124M fc1", 32768, 768, 3072);
      bench_linear("124M fc2", 32768, 3072, 768);
      bench_linear("1.3B qkv", 16384, 2048, 6144);
      bench_linear("1.3B fc1", 16384, 2048, 8192);
      bench_linear("1.3B fc2", 16384, 8192, 2048);
      bench_linear("124M lm head", 8192, 768, 50304);
      bench_mlp_gelu("124M", 32768, 768, 3072);
      bench_mlp_gelu("1.3B", 16384, 2048, 8192);
      bench_layernorm("124M", 32768, 768);
      bench_layernorm("1.3B", 16384, 2048);
      bench_cross_entropy("124M B8 T1024", 8192, 50304);
      bench_adamw();
    }
    for (AttnPath path : {AttnPath::Cudnn, AttnPath::CudnnDeterministic, AttnPath::Mcpp, AttnPath::CudnnDropout,
                          AttnPath::McppDropout}) {
      bench_attention("124M", 1024, 32, 12, 64, 0, path);
      bench_attention("1.3B", 2048, 8, 16, 128, 0, path);
      bench_attention("8K", 8192, 2, 16, 128, 0, path);
      bench_attention("1.3B GQA", 2048, 8, 16, 128, 4, path);
    }
    bench_attention_qkv_all();
  } catch (const mcpp::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
