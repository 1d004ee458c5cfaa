// CUDA LayerNorm / RMSNorm, scaled masked softmax and fused cross entropy vs the CPU backend.
#include <cstring>

#include "cuda/cuda_test_util.h"

namespace mcpp {
namespace {
using namespace cuda_test;

// Shapes for both paths: h % 8 != 0 (scalar path), h % 8 == 0 with 1..8 warps per row and 1..4 chunks per
// thread (vector path: h = 200, 768, 2048, 4104, 8192), h > 8192 (scalar), rows not a multiple of the
// rows per block, and n = 20000 x 64 (several rows per thread in the persistent backward grid); h <= 128 in row
// groups of fewer lanes than a warp (h = 128: 16 lanes, 16 rows a block; 96: 16 lanes, 4 idle; 64: 8; 32: 4; 8: 1).
struct NormCase {
  int64_t n, h;
};
const NormCase kNormCases[] = {{37, 1000}, {37, 200}, {29, 768},  {13, 2048},  {5, 4104}, {3, 8192},
                               {4, 8200},  {20000, 64}, {3001, 128}, {517, 96}, {1000, 32}, {4099, 8}};

TEST(CudaNorms, LayerNormForwardBackward) {
  MCPP_REQUIRE_CUDA();
  for (const NormCase& c : kNormCases) {
    const int64_t n = c.n, h = c.h;
    for (DType dt : float_dtypes()) {
      for (bool with_beta : {true, false}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " n=" << n << " h=" << h << " beta=" << with_beta);
        Tensor x = rnd({n, h}, 1, dt, -2, 3), gamma = rnd({h}, 2, dt), beta = rnd({h}, 3, dt), dy = rnd({n, h}, 4, dt);
        Tensor y_ref = Tensor::empty({n, h}), mean_ref = Tensor::empty({n}), rstd_ref = Tensor::empty({n});
        ops::cpu::layernorm_fwd(y_ref, mean_ref, rstd_ref, x, gamma, with_beta ? &beta : nullptr, 1e-5f, {});
        Tensor y = poisoned({n, h}, dt), mean = poisoned({n}, DType::F32), rstd = poisoned({n}, DType::F32);
        Tensor xd = dev(x, dt), gd = dev(gamma, dt), bd = dev(beta, dt);
        ops::layernorm_fwd(y, mean, rstd, xd, gd, with_beta ? &bd : nullptr, 1e-5f);
        // fp32 statistics in float (CPU: double) over h <= 8200: ~1e-6
        EXPECT_REL(host(y), y_ref, tol(dt, 1e-5));
        EXPECT_REL(host(mean), mean_ref, 1e-5);
        EXPECT_REL(host(rstd), rstd_ref, 1e-5);

        Tensor dx_ref = Tensor::empty({n, h}), dg_ref = rnd({h}, 5), db_ref = rnd({h}, 6);
        Tensor dg = dev(dg_ref), db = dev(db_ref);  // prior contents: must accumulate
        ops::cpu::layernorm_bwd(dx_ref, dg_ref, with_beta ? &db_ref : nullptr, dy, x, gamma, mean_ref, rstd_ref, {});
        Tensor dx = poisoned({n, h}, dt), dyd = dev(dy, dt);
        ops::layernorm_bwd(dx, dg, with_beta ? &db : nullptr, dyd, xd, gd, mean, rstd);
        EXPECT_REL(host(dx), dx_ref, tol(dt, 1e-5));
        EXPECT_REL(host(dg), dg_ref, 1e-5);  // fp32 sums of n terms in another order
        EXPECT_REL(host(db), db_ref, 1e-5);
        {  // both paths: fixed-order dgamma/dbeta sums (partial rows, no atomics), bit-identical reruns
          Tensor dg2 = dev(rnd({h}, 5)), db2 = dev(rnd({h}, 6)), dx2 = poisoned({n, h}, dt);
          ops::layernorm_bwd(dx2, dg2, with_beta ? &db2 : nullptr, dyd, xd, gd, mean, rstd);
          Tensor a = dg.to(Device::CPU), b = dg2.to(Device::CPU);
          EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << "dgamma differs between identical runs";
          if (with_beta) {
            Tensor c = db.to(Device::CPU), d = db2.to(Device::CPU);
            EXPECT_EQ(std::memcmp(c.raw(), d.raw(), c.nbytes()), 0) << "dbeta differs between identical runs";
          }
        }
      }
    }
  }
}

TEST(CudaNorms, RmsNormForwardBackward) {
  MCPP_REQUIRE_CUDA();
  for (const NormCase& c : kNormCases) {
    const int64_t n = c.n, h = c.h;
    for (DType dt : float_dtypes()) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " n=" << n << " h=" << h);
      Tensor x = rnd({n, h}, 7, dt), gamma = rnd({h}, 8, dt), dy = rnd({n, h}, 9, dt);
      Tensor y_ref = Tensor::empty({n, h}), rstd_ref = Tensor::empty({n});
      ops::cpu::rmsnorm_fwd(y_ref, rstd_ref, x, gamma, 1e-6f, {});
      Tensor y = poisoned({n, h}, dt), rstd = poisoned({n}, DType::F32), xd = dev(x, dt), gd = dev(gamma, dt);
      ops::rmsnorm_fwd(y, rstd, xd, gd, 1e-6f);
      EXPECT_REL(host(y), y_ref, tol(dt, 1e-5));
      EXPECT_REL(host(rstd), rstd_ref, 1e-5);
      Tensor dx_ref = Tensor::empty({n, h}), dg_ref = rnd({h}, 10), dg = dev(dg_ref);
      ops::cpu::rmsnorm_bwd(dx_ref, dg_ref, dy, x, gamma, rstd_ref, {});
      Tensor dx = poisoned({n, h}, dt);
      ops::rmsnorm_bwd(dx, dg, dev(dy, dt), xd, gd, rstd);
      EXPECT_REL(host(dx), dx_ref, tol(dt, 1e-5));
      EXPECT_REL(host(dg), dg_ref, 1e-5);
    }
  }
}

TEST(CudaNorms, UnalignedViewTakesTheScalarPath) {
  MCPP_REQUIRE_CUDA();
  const int64_t n = 9, h = 256;  // h % 8 == 0, but x / dy / dx start 2 bytes past a 16-byte boundary
  Tensor x = rnd({n, h}, 21, DType::BF16), gamma = rnd({h}, 22), dy = rnd({n, h}, 23, DType::BF16);
  Tensor y_ref = Tensor::empty({n, h}), mean_ref = Tensor::empty({n}), rstd_ref = Tensor::empty({n});
  ops::cpu::layernorm_fwd(y_ref, mean_ref, rstd_ref, x, gamma, nullptr, 1e-5f, {});
  Tensor dx_ref = Tensor::empty({n, h}), dg_ref = Tensor::zeros({h});
  ops::cpu::layernorm_bwd(dx_ref, dg_ref, nullptr, dy, x, gamma, mean_ref, rstd_ref, {});
  auto shifted = [&](const Tensor& t) {  // a [n, h] view at element offset 1 of a bigger bf16 buffer
    Tensor big = Tensor::zeros({n * h + 1}, DType::BF16, Device::CUDA);
    Tensor v = big.flat_slice(1, {n, h});
    if (t.defined()) ops::cast(v, dev(t));
    return v;
  };
  Tensor xd = shifted(x), dyd = shifted(dy), y = shifted(Tensor()), dx = shifted(Tensor());
  Tensor mean = Tensor::empty({n}, DType::F32, Device::CUDA), rstd = Tensor::empty({n}, DType::F32, Device::CUDA);
  Tensor gd = dev(gamma), dg = Tensor::zeros({h}, DType::F32, Device::CUDA);
  ops::layernorm_fwd(y, mean, rstd, xd, gd, nullptr, 1e-5f);
  ops::layernorm_bwd(dx, dg, nullptr, dyd, xd, gd, mean, rstd);
  EXPECT_REL(host(y), y_ref, 1e-2);
  EXPECT_REL(host(dx), dx_ref, 1e-2);
  EXPECT_REL(host(dg), dg_ref, 1e-5);
}

TEST(CudaSoftmax, ScaledMaskedForwardBackward) {
  MCPP_REQUIRE_CUDA();
  struct Case {
    int64_t rows, sq, sk;
    bool causal;
  };
  for (const Case& c : {Case{3, 33, 33, true}, Case{2, 5, 300, false}}) {
    for (DType dt : float_dtypes()) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " sk=" << c.sk << " causal=" << c.causal);
      const Shape sh{c.rows, c.sq, c.sk};
      Tensor x = rnd(sh, 11, dt, -3, 3), dp = rnd(sh, 12, dt);
      Tensor p_ref = Tensor::empty(sh), ds_ref = Tensor::empty(sh);
      ops::cpu::scaled_masked_softmax_fwd(p_ref, x, 0.7f, c.causal, {});
      Tensor p = poisoned(sh, dt);
      ops::scaled_masked_softmax_fwd(p, dev(x, dt), 0.7f, c.causal);
      EXPECT_REL(host(p), p_ref, tol(dt, 1e-5));  // __expf (2 ulp) and another sum order
      // backward from the CPU probs rounded like the CUDA input, so only the kernel's error is measured
      Tensor p_in = dt == DType::F32 ? p_ref : p_ref.to(dt).to(DType::F32);
      ops::cpu::scaled_masked_softmax_bwd(ds_ref, dp, p_in, 0.7f, {});
      Tensor ds = poisoned(sh, dt);
      ops::scaled_masked_softmax_bwd(ds, dev(dp, dt), dev(p_in, dt), 0.7f);
      EXPECT_REL(host(ds), ds_ref, tol(dt, 1e-5));
    }
  }
}

TEST(CudaCrossEntropy, FusedForwardBackwardAndInPlaceGrad) {
  MCPP_REQUIRE_CUDA();
  struct Case {
    int64_t n, v;
  };
  // v = 1003: scalar path; 1024 and 50304 (GPT-2's padded vocab): 16-byte vector path, the latter through
  // the 4-deep unrolled loop plus its remainder loop; 57344 is the fused fwd+bwd kernel's largest row (112
  // KiB of shared memory), 65536 beyond it (the two kernels); 400 and 300 rows: more rows than the GPU holds
  // blocks at once (the fused kernel runs two 512-thread rows per SM).
  for (const Case& c : {Case{29, 1003}, Case{29, 1024}, Case{6, 50304}, Case{2, 57344}, Case{3, 65536},
                        Case{400, 50304}, Case{300, 8192}}) {
    const int64_t n = c.n, v = c.v;
    Tensor targets = Tensor::empty({n}, DType::I32);
    for (int64_t i = 0; i < n; ++i) targets.data<int32_t>()[i] = static_cast<int32_t>((i * 131 + 7) % v);
    targets.data<int32_t>()[n - 1] = static_cast<int32_t>(v - 1);  // the last column
    Tensor td = targets.to(Device::CUDA);
    for (DType dt : float_dtypes()) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " v=" << v);
      Tensor logits = rnd({n, v}, 13, dt, -6, 6), dloss = rnd({n}, 14);
      Tensor loss_ref = Tensor::empty({n}), lse_ref = Tensor::empty({n}), dl_ref = Tensor::empty({n, v});
      ops::cpu::cross_entropy_fwd(loss_ref, lse_ref, logits, targets, {});
      ops::cpu::cross_entropy_bwd(dl_ref, dloss, logits, targets, lse_ref, {});
      Tensor loss = poisoned({n}, DType::F32), lse = poisoned({n}, DType::F32), ld = dev(logits, dt);
      ops::cross_entropy_fwd(loss, lse, ld, td);
      // fp32 online logsumexp vs the CPU's double sum: ~1e-6; loss and lse are fp32 for bf16 logits too
      EXPECT_REL(host(loss), loss_ref, 1e-5);
      EXPECT_REL(host(lse), lse_ref, 1e-5);
      Tensor dloss_d = dev(dloss);
      Tensor dl = poisoned({n, v}, dt);
      ops::cross_entropy_bwd(dl, dloss_d, ld, td, lse);  // separate output
      EXPECT_REL(host(dl), dl_ref, tol(dt, 1e-5));
      ops::cross_entropy_bwd(ld, dloss_d, ld, td, lse);  // in place: dlogits aliases logits
      EXPECT_REL(host(ld), dl_ref, tol(dt, 1e-5));
      // Forward + backward in one op (the fused kernel for 2-byte logits, V % 8 == 0, V <= 56K; the two
      // kernels otherwise), in place as the GPT's loss uses it and into a separate output.
      Tensor loss2 = poisoned({n}, DType::F32), lse2 = poisoned({n}, DType::F32), ld2 = dev(logits, dt);
      ops::cross_entropy_fwd_bwd(loss2, lse2, ld2, ld2, td, dloss_d);
      EXPECT_REL(host(loss2), loss_ref, 1e-5);
      EXPECT_REL(host(lse2), lse_ref, 1e-5);
      EXPECT_REL(host(ld2), dl_ref, tol(dt, 1e-5));
      Tensor ld3 = dev(logits, dt), dl3 = poisoned({n, v}, dt);
      ops::cross_entropy_fwd_bwd(loss2, lse2, dl3, ld3, td, dloss_d);
      EXPECT_REL(host(dl3), dl_ref, tol(dt, 1e-5));
      EXPECT_EQ(rel_err(host(ld3), logits), 0.0) << "the input must stay untouched";
    }
  }
}

// Vocab-parallel cross entropy on one TP slice [vocab_start, vocab_start + v) vs the CPU ops: the partials
// (row max, sum of exp, target logit; targets inside and outside the slice) and the backward with a given
// global lse, separate output and in place; the combine steps between the TP all-reduces.
TEST(CudaVocabParallelCrossEntropy, PartialsAndBackwardMatchCpu) {
  MCPP_REQUIRE_CUDA();
  // v = 1000: the 16-byte vector path's tail loop only; 1001: the scalar path; 25152 (GPT-2's 50304 at
  // tp 2): the vector path's unrolled loop too (> 4 x 256 chunks of 8), targets spread over the row.
  struct Case {
    int64_t n, v;
  };
  for (const Case& c : {Case{37, 1000}, Case{37, 1001}, Case{9, 25152}}) {
    for (DType dt : float_dtypes()) {
      const int64_t n = c.n, v = c.v, vocab_start = 2000;
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " v=" << v);
      Tensor targets = Tensor::empty({n}, DType::I32);
      for (int64_t i = 0; i < n; ++i)  // every third row's target outside the slice (below or above it)
        targets.data<int32_t>()[i] =
            static_cast<int32_t>(i % 3 == 0 ? (i % 2 ? 5 : vocab_start + v + 500) : vocab_start + (i * 7919) % v);
      Tensor td = targets.to(Device::CUDA);
      Tensor logits = rnd({n, v}, 31, dt, -6, 6), dloss = rnd({n}, 32), lse = rnd({n}, 33, DType::F32, 7, 9);
      Tensor mx_ref = Tensor::empty({n}), se_ref = Tensor::empty({n}), tl_ref = Tensor::empty({n});
      ops::cpu::vocab_parallel_ce_partials(mx_ref, se_ref, tl_ref, logits, targets, vocab_start, {});
      Tensor ld = dev(logits, dt);
      Tensor mx = poisoned({n}, DType::F32), se = poisoned({n}, DType::F32), tl = poisoned({n}, DType::F32);
      ops::vocab_parallel_ce_partials(mx, se, tl, ld, td, vocab_start);
      EXPECT_REL(host(mx), mx_ref, 1e-6);
      EXPECT_REL(host(se), se_ref, 1e-5);
      EXPECT_REL(host(tl), tl_ref, 1e-6);
      Tensor dl_ref = Tensor::empty({n, v});
      ops::cpu::vocab_parallel_ce_bwd(dl_ref, dloss, logits, targets, lse, vocab_start, {});
      Tensor dloss_d = dev(dloss), lse_d = dev(lse), dl = poisoned({n, v}, dt);
      ops::vocab_parallel_ce_bwd(dl, dloss_d, ld, td, lse_d, vocab_start);
      EXPECT_REL(host(dl), dl_ref, tol(dt, 1e-5));
      ops::vocab_parallel_ce_bwd(ld, dloss_d, ld, td, lse_d, vocab_start);  // in place
      EXPECT_REL(host(ld), dl_ref, tol(dt, 1e-5));
    }
  }
  // The combine steps (between the TP all-reduces) vs the CPU ops.
  const int64_t n = 37;
  Tensor mx = rnd({n}, 34, DType::F32, -3, 3), se = rnd({n}, 35, DType::F32, 1, 900);
  Tensor gmax = rnd({n}, 36, DType::F32, 3, 4), ss = rnd({n}, 37, DType::F32, 1, 3), tl = rnd({n}, 38);
  Tensor ll_ref = Tensor::empty({n}), sc_ref = Tensor::empty({n}), loss_ref = Tensor::empty({n}),
         lse_ref = Tensor::empty({n});
  ops::cpu::vocab_parallel_ce_local_lse(ll_ref, mx, se, {});
  ops::cpu::vocab_parallel_ce_rescale(sc_ref, ll_ref, gmax, {});
  ops::cpu::vocab_parallel_ce_finish(loss_ref, lse_ref, gmax, ss, tl, {});
  Tensor ll = poisoned({n}, DType::F32), sc = poisoned({n}, DType::F32), loss = poisoned({n}, DType::F32),
         lse = poisoned({n}, DType::F32);
  ops::vocab_parallel_ce_local_lse(ll, dev(mx), dev(se));
  ops::vocab_parallel_ce_rescale(sc, dev(ll_ref), dev(gmax));
  ops::vocab_parallel_ce_finish(loss, lse, dev(gmax), dev(ss), dev(tl));
  EXPECT_REL(host(ll), ll_ref, 1e-6);
  EXPECT_REL(host(sc), sc_ref, 1e-6);
  EXPECT_REL(host(loss), loss_ref, 1e-6);
  EXPECT_REL(host(lse), lse_ref, 1e-6);
}

}  // namespace
}  // namespace mcpp
