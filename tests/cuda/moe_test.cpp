// CUDA mixture-of-experts ops (kernels/cuda/moe.cpp) against the CPU backend. Row movement: float32 (the same fp32
// math per element: exact for the copies, summation order of the k routes identical) and bf16 (inputs rounded
// once; outputs rounded to bf16). The router: the same experts chosen and positions (exact), softmaxes and the
// backward within fp32 rounding (the CPU sums in double). The whole MoE model on CUDA: tests/cuda/gpt_model_test.cpp
// (CudaGPTModel.*Moe*).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>

#include "cuda/cuda_test_util.h"
#include "mcpp/distributed/param_and_grad_buffer.h"
#include "mcpp/transformer/moe/router.h"
#include "models/gpt_test_util.h"

namespace mcpp {
namespace {
using namespace cuda_test;

Tensor idx_tensor(int64_t n, int64_t k, uint64_t seed) {  // a random permutation of 0..n*k-1 as [n, k]
  std::vector<int32_t> v(static_cast<size_t>(n * k));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(i);
  uint64_t st = seed;
  for (size_t i = v.size(); i > 1; --i) {
    st = st * 6364136223846793005ULL + 1442695040888963407ULL;
    std::swap(v[i - 1], v[static_cast<size_t>((st >> 33) % i)]);
  }
  Tensor t = Tensor::empty({n, k}, DType::I32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

// h 96: the 8-wide kernels (16-byte rows); h 36: the scalar ones. drop: every 5th route dropped (idx -1; the rows
// no route names start zero on both sides).
void check(DType dt, int64_t h, bool drop = false) {
  SCOPED_TRACE(fmt::format("h {} drop {}", h, drop));
  const int64_t n = 37, k = 3, m = n * k;
  Tensor idx = idx_tensor(n, k, 5);
  if (drop)
    for (int64_t q = 0; q < n * k; q += 5) idx.data<int32_t>()[q] = -1;
  Tensor didx = idx.to(Device::CUDA);
  auto start = [&](const Shape& shape) { return drop ? Tensor::zeros(shape, dt, Device::CUDA) : poisoned(shape, dt); };
  Tensor x = rnd({n, h}, 1, dt), in = rnd({m, h}, 2, dt), dy = rnd({n, h}, 3, dt), w = rnd({n, k}, 4);
  // permute: a copy, exact in any dtype
  Tensor out_cpu = Tensor::zeros({m, h});
  ops::cpu::moe_permute(out_cpu, x, idx, {});
  Tensor out = start({m, h});
  ops::moe_permute(out, dev(x, dt), didx);
  EXPECT_EQ(rel_err(host(out), out_cpu), 0.0);
  // unpermute with and without weights
  Tensor y_cpu = Tensor::empty({n, h}), y1_cpu = Tensor::empty({n, h});
  ops::cpu::moe_unpermute(y_cpu, in, idx, &w, {});
  ops::cpu::moe_unpermute(y1_cpu, in, idx, nullptr, {});
  Tensor dw_dev = dev(w), y = poisoned({n, h}, dt), y1 = poisoned({n, h}, dt);
  ops::moe_unpermute(y, dev(in, dt), didx, &dw_dev);
  ops::moe_unpermute(y1, dev(in, dt), didx, nullptr);
  const double tol = dt == DType::F32 ? 1e-6 : 4e-3;  // bf16: one output rounding (2^-9 relative)
  EXPECT_LT(rel_err(host(y), y_cpu), tol);
  EXPECT_LT(rel_err(host(y1), y1_cpu), tol);
  // backward: din rows exact up to the output rounding, dw a dot product over h (fp32, another order)
  Tensor din_cpu = Tensor::zeros({m, h}), dwt_cpu = Tensor::empty({n, k});
  ops::cpu::moe_unpermute_bwd(din_cpu, dwt_cpu, dy, in, idx, w, {});
  Tensor din = start({m, h}), dwt = poisoned({n, k}, DType::F32);
  ops::moe_unpermute_bwd(din, dwt, dev(dy, dt), dev(in, dt), didx, dw_dev);
  EXPECT_LT(rel_err(host(din), din_cpu), tol);
  EXPECT_LT(rel_err(host(dwt), dwt_cpu), 1e-5);
}

// The router ops: top-k + softmaxes (the same choices: the logits are spaced, no near-ties), the expert-major
// route positions (exact), and the router backward, against the CPU backend; logits fp32 or bf16.
// opt: the score function and group-limited routing (z_coef is set here: 0.01 for softmax, 0 for sigmoid).
void check_router(DType dt, ops::MoeTopkOptions opt) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " pre " << opt.pre_softmax << " sigmoid " << opt.sigmoid
                                    << " groups " << opt.num_groups << "/" << opt.group_topk);
  const int64_t n = 300, e = 16, k = 3;
  Tensor logits = rnd({n, e}, 7, dt, -3.0, 3.0);
  opt.z_coef = opt.sigmoid ? 0.0f : 0.01f;
  Tensor topk = Tensor::empty({n, k}, DType::I32), probs = Tensor::empty({n, k}), scores = Tensor::empty({n, e});
  Tensor lse = Tensor::empty({n});
  ops::cpu::moe_topk_softmax(topk, probs, scores, lse, logits, opt, {});
  Tensor dtopk = Tensor::empty({n, k}, DType::I32, Device::CUDA), dprobs_out = poisoned({n, k}, DType::F32);
  Tensor dscores = poisoned({n, e}, DType::F32), dlse = poisoned({n}, DType::F32);
  ops::MoeTopkOptions dopt = opt;  // the expert bias on the GPU
  if (opt.expert_bias.defined()) dopt.expert_bias = dev(opt.expert_bias);
  if (opt.logit_bias.defined()) dopt.logit_bias = dev(opt.logit_bias);
  ops::moe_topk_softmax(dtopk, dprobs_out, dscores, dlse, dev(logits, dt), dopt);
  Tensor htopk = dtopk.to(Device::CPU);
  EXPECT_EQ(std::memcmp(htopk.raw(), topk.raw(), topk.nbytes()), 0) << "different experts chosen";
  EXPECT_LT(rel_err(host(dprobs_out), probs), 1e-6);
  EXPECT_LT(rel_err(host(dscores), scores), 1e-6);
  EXPECT_LT(rel_err(host(dlse), lse), 1e-6);
  // positions
  Tensor idx = Tensor::empty({n, k}, DType::I32), counts = Tensor::empty({e}, DType::I64);
  ops::cpu::moe_route_positions(idx, counts, topk, {});
  Tensor didx = Tensor::empty({n, k}, DType::I32, Device::CUDA), dcounts = Tensor::empty({e}, DType::I64, Device::CUDA);
  ops::moe_route_positions(didx, dcounts, dtopk);
  Tensor hidx = didx.to(Device::CPU), hcounts = dcounts.to(Device::CPU);
  EXPECT_EQ(std::memcmp(hidx.raw(), idx.raw(), idx.nbytes()), 0);
  EXPECT_EQ(std::memcmp(hcounts.raw(), counts.raw(), counts.nbytes()), 0);
  // backward
  Tensor dp = rnd({n, k}, 8), aux = rnd({e}, 9);
  Tensor dl = Tensor::empty({n, e});
  ops::cpu::moe_topk_softmax_bwd(dl, dp, probs, topk, scores, lse, aux, opt, {});
  Tensor ddl = poisoned({n, e}, dt);
  ops::moe_topk_softmax_bwd(ddl, dev(dp), dprobs_out, dtopk, dscores, dlse, dev(aux), dopt);
  EXPECT_LT(rel_err(host(ddl), dl), dt == DType::F32 ? 1e-5 : 4e-3);  // bf16: one output rounding
  // the sequence-wise loss's per-sequence gradient rows: token t reads row t % 5
  const Tensor aux_rows = rnd({5, e}, 10);
  ops::cpu::moe_topk_softmax_bwd(dl, dp, probs, topk, scores, lse, aux_rows, opt, {});
  ops::moe_topk_softmax_bwd(ddl, dev(dp), dprobs_out, dtopk, dscores, dlse, dev(aux_rows), dopt);
  EXPECT_LT(rel_err(host(ddl), dl), dt == DType::F32 ? 1e-5 : 4e-3);
}

TEST(CudaMoeOps, RouterFp32MatchesCpu) { MCPP_REQUIRE_CUDA(); check_router(DType::F32, {}); }
TEST(CudaMoeOps, RouterBf16PreSoftmaxMatchesCpu) {
  MCPP_REQUIRE_CUDA();
  check_router(DType::BF16, {.pre_softmax = true});
}
// DeepSeek-V3's router (sigmoid scores, group-limited routing, the expert bias) and group-limited softmax routing.
TEST(CudaMoeOps, RouterSigmoidAndGroupLimitedMatchCpu) {
  MCPP_REQUIRE_CUDA();
  for (DType dt : {DType::F32, DType::BF16}) {
    check_router(dt, {.sigmoid = true});
    check_router(dt, {.sigmoid = true, .num_groups = 4, .group_topk = 2});
    check_router(dt, {.num_groups = 8, .group_topk = 3});
    check_router(dt, {.pre_softmax = true, .num_groups = 2, .group_topk = 1});
    const Tensor bias = rnd({16}, 11, DType::F32, -0.3, 0.3);  // aux-loss-free balancing's routing bias
    check_router(dt, {.sigmoid = true, .expert_bias = bias});
    check_router(dt, {.sigmoid = true, .num_groups = 4, .group_topk = 2, .expert_bias = bias});
  }
}
// Megatron's sinkhorn routing: moe_sinkhorn's log d1 (float32 on the GPU) within 5e-4 of the CPU's float64 (the
// rounding, and at most one iteration more or less around the tolerance); the experts chosen by the logits + that
// bias (pre-softmax top-3, float32 and bf16 logits) exactly the CPU's.
TEST(CudaMoeOps, SinkhornMatchesCpu) {
  MCPP_REQUIRE_CUDA();
  for (const auto& [n, e] : {std::pair<int64_t, int64_t>{300, 16}, {4096, 8}, {2000, 64}, {64, 1024}, {0, 4}}) {
    SCOPED_TRACE(fmt::format("n {} E {}", n, e));
    const Tensor logits = n > 0 ? rnd({n, e}, 21, DType::F32, -3.0, 3.0) : Tensor::empty({0, e});
    Tensor ld = Tensor::empty({e}), dld = poisoned({e}, DType::F32);
    ops::cpu::moe_sinkhorn(ld, logits, 1e-4f, {});
    ops::moe_sinkhorn(dld, n > 0 ? dev(logits) : Tensor::empty({0, e}, DType::F32, Device::CUDA), 1e-4f);
    const Tensor h = host(dld);
    double worst = 0.0;
    for (int64_t j = 0; j < e; ++j)
      worst = std::max(worst, std::abs(double{h.data<float>()[j]} - double{ld.data<float>()[j]}));
    EXPECT_LT(worst, 5e-4);
  }
  const Tensor logits = rnd({300, 16}, 7, DType::F32, -3.0, 3.0);
  Tensor bias = Tensor::empty({16});
  ops::cpu::moe_sinkhorn(bias, logits, 1e-4f, {});
  for (DType dt : {DType::F32, DType::BF16}) check_router(dt, {.pre_softmax = true, .logit_bias = bias});
}
// --moe-router-dtype fp32 on a bf16 model: the logits GEMM (and the backward's) in float32 on the upcast bf16
// input and weight, so the router equals a float32 router on the same bf16-valued operands (CPU) to fp32 rounding —
// the same experts, probabilities, losses' gradients and weight grad — where the default bf16 GEMM rounds the
// logits to bf16's ~3 digits (measured here as a larger error, so the flag is shown to act).
TEST(CudaMoeRouter, Fp32RouterDtypeMatchesAnFp32RouterOnBf16Operands) {
  MCPP_REQUIRE_CUDA();
  const int64_t n = 96, e = 16, k = 2;
  double err[2] = {0.0, 0.0};  // the probabilities' error without / with the flag
  for (bool fp32 : {false, true}) {
    SCOPED_TRACE(fp32 ? "moe_router_dtype fp32" : "bf16 logits");
    TransformerConfig c = testing::tiny_config("gpt2");
    c.num_moe_experts = e;
    c.moe_router_topk = k;
    c.moe_aux_loss_coeff = 0.01f;
    c.moe_z_loss_coeff = 0.001f;
    c.moe_router_dtype = fp32 ? "fp32" : "";
    c.finalize();
    c.validate();
    const int64_t h = c.hidden_size;
    ParamAndGradBuffer pg, pc;
    moe::TopKRouter rg(pg, "router", c, testing::single_tp()), rc(pc, "router", c, testing::single_tp());
    pg.finalize(5, Device::CUDA, DType::BF16);
    pc.finalize(5);
    rc.weight()->data.copy_from(host(rg.weight()->data));  // the bf16 weight's values, in fp32 on the CPU
    const Tensor x = rnd({n, h}, 21, DType::BF16, -2.0, 2.0), dp = rnd({n, k}, 22);
    moe::RouterCtx cg, cc;
    rg.forward(cg, dev(x, DType::BF16), 1);
    rc.forward(cc, x, 1);
    Tensor dpg = dev(dp), dpc = dp.clone();
    const Tensor dxg = rg.backward(cg, dpg, 0.5f), dxc = rc.backward(cc, dpc, 0.5f);
    err[fp32] = rel_err(host(cg.probs), cc.probs);
    if (!fp32) continue;
    EXPECT_EQ(std::memcmp(cg.topk.to(Device::CPU).raw(), cc.topk.raw(), cc.topk.nbytes()), 0) << "other experts";
    EXPECT_LT(err[1], 1e-5);
    EXPECT_LT(rel_err(host(cg.scores), cc.scores), 1e-5);
    EXPECT_LT(rel_err(host(cg.lse), cc.lse), 1e-5);
    EXPECT_EQ(dxg.dtype(), DType::BF16);
    EXPECT_LT(rel_err(host(dxg), dxc), 8e-3);  // one bf16 rounding of dx
    EXPECT_LT(rel_err(host(rg.weight()->main_grad), rc.weight()->main_grad), 1e-4);  // fp32 main grad
  }
  EXPECT_GT(err[0], 20 * err[1]) << "the bf16 logits are as close as the fp32 ones: the flag changed nothing";
}

TEST(CudaMoeOps, RoutePositionsAtScale) {  // more routes than one scan chunk per expert, uneven experts
  MCPP_REQUIRE_CUDA();
  const int64_t n = 20000, k = 2, e = 8;
  Tensor topk = Tensor::empty({n, k}, DType::I32);
  for (int64_t q = 0; q < n * k; ++q)
    topk.data<int32_t>()[q] = static_cast<int32_t>((q * q + 3 * q) % 7 == 0 ? 7 : q % 5);
  Tensor idx = Tensor::empty({n, k}, DType::I32), counts = Tensor::empty({e}, DType::I64);
  ops::cpu::moe_route_positions(idx, counts, topk, {});
  Tensor didx = Tensor::empty({n, k}, DType::I32, Device::CUDA), dcounts = Tensor::empty({e}, DType::I64, Device::CUDA);
  ops::moe_route_positions(didx, dcounts, topk.to(Device::CUDA));
  Tensor hidx = didx.to(Device::CPU), hcounts = dcounts.to(Device::CPU);
  EXPECT_EQ(std::memcmp(hidx.raw(), idx.raw(), idx.nbytes()), 0);
  EXPECT_EQ(std::memcmp(hcounts.raw(), counts.raw(), counts.nbytes()), 0);
  EXPECT_EQ(counts.data<int64_t>()[5], 0);  // an expert no route chose
  // the chunked kernels' limit (256 experts) and past it (one block per expert), a partial last chunk
  for (int64_t ee : {int64_t{256}, int64_t{300}}) {
    SCOPED_TRACE(ee);
    const int64_t nn = 3001;
    Tensor t = Tensor::empty({nn, k}, DType::I32);
    for (int64_t q = 0; q < nn * k; ++q)  // the last 5 experts chosen by no route
      t.data<int32_t>()[q] = static_cast<int32_t>((q * 7919 + q / 3) % ee % (ee - 5));
    Tensor want = Tensor::empty({nn, k}, DType::I32), wc = Tensor::empty({ee}, DType::I64);
    ops::cpu::moe_route_positions(want, wc, t, {});
    Tensor got = Tensor::empty({nn, k}, DType::I32, Device::CUDA), gc = Tensor::empty({ee}, DType::I64, Device::CUDA);
    ops::moe_route_positions(got, gc, t.to(Device::CUDA));
    EXPECT_EQ(std::memcmp(got.to(Device::CPU).raw(), want.raw(), want.nbytes()), 0);
    EXPECT_EQ(std::memcmp(gc.to(Device::CPU).raw(), wc.raw(), wc.nbytes()), 0);
  }
  // the load-balancing statistics: per expert, per sequence (the shared-memory histogram and, for many rows, the
  // global atomics), only the kept routes
  for (int64_t g : {1, 16, 1500}) {
    SCOPED_TRACE(g);
    Tensor want = Tensor::empty({g, e}), want_kept = Tensor::empty({g, e});
    Tensor kept_idx = idx.clone();
    for (int64_t q = 0; q < n * k; q += 3) kept_idx.data<int32_t>()[q] = -1;
    ops::cpu::moe_route_counts(want, topk, nullptr, {});
    ops::cpu::moe_route_counts(want_kept, topk, &kept_idx, {});
    Tensor got = poisoned({g, e}, DType::F32), got_kept = poisoned({g, e}, DType::F32);
    const Tensor dkept_idx = kept_idx.to(Device::CUDA), dtopk = topk.to(Device::CUDA);
    ops::moe_route_counts(got, dtopk, nullptr);
    ops::moe_route_counts(got_kept, dtopk, &dkept_idx);
    EXPECT_EQ(std::memcmp(got.to(Device::CPU).raw(), want.raw(), want.nbytes()), 0);
    EXPECT_EQ(std::memcmp(got_kept.to(Device::CPU).raw(), want_kept.raw(), want_kept.nbytes()), 0);
  }
}

// Capacity drops (moe_capacity_positions) against the CPU backend, exactly: uneven experts over several scan chunks,
// probabilities from 37 values (many ties at the threshold) and distinct ones, both policies, padded or not,
// capacities from 0 to above every expert's count.
TEST(CudaMoeOps, CapacityPositionsMatchCpu) {
  MCPP_REQUIRE_CUDA();
  const int64_t n = 9000, k = 2, e = 8;
  Tensor topk = Tensor::empty({n, k}, DType::I32), probs = Tensor::empty({n, k});
  for (int64_t q = 0; q < n * k; ++q)
    topk.data<int32_t>()[q] = static_cast<int32_t>((q * q + 3 * q) % 7 == 0 ? 7 : q % 5);
  Tensor idx = Tensor::empty({n, k}, DType::I32), counts = Tensor::empty({e}, DType::I64);
  ops::cpu::moe_route_positions(idx, counts, topk, {});
  const Tensor dtopk = topk.to(Device::CUDA), dcounts = counts.to(Device::CUDA);
  for (bool ties : {true, false}) {
    for (int64_t q = 0; q < n * k; ++q)
      probs.data<float>()[q] = ties ? 0.01f * static_cast<float>((q * 7919) % 37) : 1.0f / (1.0f + 1e-4f * q);
    const Tensor dprobs = probs.to(Device::CUDA);
    for (int64_t cap : {0, 1, 700, 1500, 3000, 20000})
      for (bool by_probs : {true, false})
        for (bool pad : {false, true}) {
          SCOPED_TRACE(fmt::format("ties {} capacity {} by_probs {} pad {}", ties, cap, by_probs, pad));
          const ops::MoeCapacityOptions opt{.capacity = cap, .by_probs = by_probs, .pad = pad};
          Tensor want = Tensor::empty({n, k}, DType::I32), kept = Tensor::empty({e}, DType::I64);
          ops::cpu::moe_capacity_positions(want, kept, topk, probs, counts, opt, {});
          Tensor got = idx.to(Device::CUDA), dkept = Tensor::empty({e}, DType::I64, Device::CUDA);  // in: dropless
          ops::moe_capacity_positions(got, dkept, dtopk, dprobs, dcounts, opt);
          EXPECT_EQ(std::memcmp(got.to(Device::CPU).raw(), want.raw(), want.nbytes()), 0);
          EXPECT_EQ(std::memcmp(dkept.to(Device::CPU).raw(), kept.raw(), kept.nbytes()), 0);
        }
  }
}

TEST(CudaMoeOps, Fp32MatchesCpu) {
  MCPP_REQUIRE_CUDA();
  for (int64_t h : {96, 36})
    for (bool drop : {false, true}) check(DType::F32, h, drop);
}
TEST(CudaMoeOps, Bf16MatchesCpu) {
  MCPP_REQUIRE_CUDA();
  for (int64_t h : {96, 36})
    for (bool drop : {false, true}) check(DType::BF16, h, drop);
}

}  // namespace
}  // namespace mcpp
