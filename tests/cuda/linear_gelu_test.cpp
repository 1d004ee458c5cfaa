// CUDA linear_gelu_fwd / linear_dgelu_bwd (cuBLASLt GELU_AUX(_BIAS) / DGELU(_BGRAD) epilogues) vs the CPU
// backend's unfused composition, fp32 and bf16, with and without bias / bias grad, at a small odd-row shape,
// at a TP-shard shape (GPT-2 124M fc1 at tp = 2: h 768, f 3072/2 = 1536), and at a shape cuBLASLt's aux
// rule excludes (f % 8 != 0), which must take the explicit unfused fallback. cuda_epilogue_fusion_counts()
// shows which path ran; bf16 at the aligned shapes must be fused (the production case).
// Tolerances (relative L2, beside each assert): pre_act (GEMM + bias) fp32 1e-5 (summation order), bf16 4e-3
// (one bf16 rounding, 2^-9 per element). GELU / GELU' outputs: on the unfused path fp32 1e-5 (tanhf vs the
// CPU's GELU, ~1e-6); through the cuBLASLt epilogue, whose GELU may use the hardware tanh approximation
// (tanh.approx.f32, relative error <= 2^-11 ~ 5e-4 in t; GELU' multiplies it by up to ~5 at |x| ~ 3), fp32
// act 1e-3 and dpre 5e-3; bf16 adds one output rounding (1e-2). Every measured error is printed.
#include "cuda/cuda_test_util.h"

namespace mcpp {
namespace {
using namespace cuda_test;

struct Shape3 {
  int64_t n, h, f;  // tokens, fc1 input (hidden), fc1 output (ffn per rank)
};

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  Tensor ha = a.to(Device::CPU), hb = b.to(Device::CPU);
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
}

void check_forward(const Shape3& sh, DType dt, bool with_bias) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " n=" << sh.n << " h=" << sh.h << " f=" << sh.f
                                    << (with_bias ? " bias" : " no bias"));
  Tensor x = rnd({sh.n, sh.h}, 21, dt, -2.0, 2.0), w = rnd({sh.f, sh.h}, 22, dt, -0.1, 0.1), b = rnd({sh.f}, 23, dt);
  Tensor pre_ref = Tensor::empty({sh.n, sh.f}), act_ref = Tensor::empty({sh.n, sh.f});
  ops::cpu::linear_gelu_fwd(act_ref, pre_ref, x, w, with_bias ? &b : nullptr, {});
  Tensor act = poisoned({sh.n, sh.f}, dt), pre = poisoned({sh.n, sh.f}, dt), bd = dev(b, dt);
  const int64_t fused0 = ops::cuda_epilogue_fusion_counts().fwd_fused;
  ops::linear_gelu_fwd(act, pre, dev(x, dt), dev(w, dt), with_bias ? &bd : nullptr);
  const bool fused = ops::cuda_epilogue_fusion_counts().fwd_fused > fused0;
  EXPECT_REL(host(pre), pre_ref, tol(dt, 1e-5, 4e-3));  // bf16: one rounding of the fp32 GEMM + bias
  // fused: the epilogue's tanh (see the header); bf16: + one rounding (+ the fallback's GELU of bf16 pre_act)
  EXPECT_REL(host(act), act_ref, tol(dt, fused ? 1e-3 : 1e-5, 1e-2));
}

void check_backward(const Shape3& sh, DType dt, bool with_db) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " n=" << sh.n << " h=" << sh.h << " f=" << sh.f
                                    << (with_db ? " db" : " no db"));
  // fc2's W [h, f]; dy [n, h]; pre_act [n, f] (bf16-representable, so CPU and GPU read the same values)
  Tensor dy = rnd({sh.n, sh.h}, 31, dt), w = rnd({sh.h, sh.f}, 32, dt, -0.1, 0.1), pre = rnd({sh.n, sh.f}, 33, dt, -3, 3);
  Tensor db0 = rnd({sh.f}, 34);
  Tensor dpre_ref = Tensor::empty({sh.n, sh.f}), db_ref = db0.clone();
  ops::cpu::linear_dgelu_bwd(dpre_ref, with_db ? &db_ref : nullptr, dy, w, pre, {});
  Tensor dyd = dev(dy, dt), wd = dev(w, dt), pred = dev(pre, dt);
  Tensor dpre = poisoned({sh.n, sh.f}, dt), db = dev(db0);  // fp32 main grad with prior contents: accumulates
  const auto c0 = ops::cuda_epilogue_fusion_counts();
  ops::linear_dgelu_bwd(dpre, with_db ? &db : nullptr, dyd, wd, pred);
  const auto c1 = ops::cuda_epilogue_fusion_counts();
  const bool fused = c1.bwd_dgelu_bgrad + c1.bwd_dgelu > c0.bwd_dgelu_bgrad + c0.bwd_dgelu;
  // fused: the epilogue's GELU' (see the header); bf16: one rounding of (fp32 dgrad) * gelu'
  EXPECT_REL(host(dpre), dpre_ref, tol(dt, fused ? 5e-3 : 1e-5, 1e-2));
  if (!with_db) return;
  // fp32: sums of dpre (its error above, random signs, averages down); bf16: the DGELU + column-sum and
  // fallback paths sum the bf16-rounded dpre (each term off by <= 2^-9: ~1e-3 of a column sum).
  EXPECT_REL(host(db), db_ref, tol(dt, fused ? 5e-3 : 1e-5, 1e-2));
  // Run to run: dpre is bitwise the same (one GEMM). db is bitwise the same where cuBLASLt's DGELU_BGRAD
  // summed it (fp32; measured on the H200). The DGELU + column-sum path (bf16: cuBLASLt has no fp32 bias
  // grad for a bf16 output) and the fallback use launch_column_sum_acc, which adds row-chunk partials with
  // atomicAdd (elementwise_kernels.cu, as linear_bwd's bias grads do), so with n > 512 rows its last bits
  // may differ between runs (measured at n = 1024): there, within 1e-6 relative (summation order only).
  const bool bgrad_epilogue = c1.bwd_dgelu_bgrad > c0.bwd_dgelu_bgrad;
  Tensor dpre2 = poisoned({sh.n, sh.f}, dt), db2 = dev(db0);
  ops::linear_dgelu_bwd(dpre2, &db2, dyd, wd, pred);
  EXPECT_TRUE(bitwise_equal(dpre2, dpre));
  if (bgrad_epilogue) EXPECT_TRUE(bitwise_equal(db2, db));
  else EXPECT_REL(host(db2), host(db), 1e-6);
}

void print_counts(const char* when) {
  const auto c = ops::cuda_epilogue_fusion_counts();
  std::printf("[ fusion   ] %s: fwd fused %lld fallback %lld | bwd dgelu_bgrad %lld dgelu %lld fallback %lld\n", when,
              static_cast<long long>(c.fwd_fused), static_cast<long long>(c.fwd_fallback),
              static_cast<long long>(c.bwd_dgelu_bgrad), static_cast<long long>(c.bwd_dgelu),
              static_cast<long long>(c.bwd_fallback));
}

TEST(CudaLinearGelu, ForwardMatchesCpuAtSmallAndTpShardShapes) {
  MCPP_REQUIRE_CUDA();
  for (const Shape3& sh : {Shape3{77, 64, 96}, Shape3{1024, 768, 1536}})
    for (DType dt : float_dtypes())
      for (bool bias : {true, false}) {
        const auto before = ops::cuda_epilogue_fusion_counts();
        check_forward(sh, dt, bias);
        const auto after = ops::cuda_epilogue_fusion_counts();
        EXPECT_EQ(after.fwd_fused + after.fwd_fallback, before.fwd_fused + before.fwd_fallback + 1);
        if (dt == DType::BF16) {
          EXPECT_EQ(after.fwd_fused, before.fwd_fused + 1) << "bf16 GELU_AUX not taken";
        }
      }
  print_counts("forward, aligned shapes (fp32 may fall back where cuBLASLt has no fp32 GELU epilogue)");
}

TEST(CudaLinearGelu, BackwardMatchesCpuAccumulatesAndIsDeterministic) {
  MCPP_REQUIRE_CUDA();
  for (const Shape3& sh : {Shape3{77, 64, 96}, Shape3{1024, 768, 1536}})
    for (DType dt : float_dtypes())
      for (bool with_db : {true, false}) {
        const auto before = ops::cuda_epilogue_fusion_counts();
        check_backward(sh, dt, with_db);
        const auto after = ops::cuda_epilogue_fusion_counts();
        if (dt == DType::BF16) {
          EXPECT_GT(after.bwd_dgelu_bgrad + after.bwd_dgelu, before.bwd_dgelu_bgrad + before.bwd_dgelu)
              << "bf16 DGELU epilogue not taken";
        }
      }
  print_counts("backward, aligned shapes");
}

TEST(CudaLinearGelu, UnalignedFfnTakesTheExplicitFallback) {
  MCPP_REQUIRE_CUDA();
  const Shape3 sh{50, 64, 100};  // f = 100: cuBLASLt's aux ld must be a multiple of 8
  for (DType dt : float_dtypes()) {
    auto before = ops::cuda_epilogue_fusion_counts();
    check_forward(sh, dt, /*with_bias=*/true);
    auto after = ops::cuda_epilogue_fusion_counts();
    EXPECT_EQ(after.fwd_fallback, before.fwd_fallback + 1);
    EXPECT_EQ(after.fwd_fused, before.fwd_fused);
    before = after;
    check_backward(sh, dt, /*with_db=*/true);  // two calls (the determinism re-run)
    after = ops::cuda_epilogue_fusion_counts();
    EXPECT_EQ(after.bwd_fallback, before.bwd_fallback + 2);
    EXPECT_EQ(after.bwd_dgelu_bgrad + after.bwd_dgelu, before.bwd_dgelu_bgrad + before.bwd_dgelu);
  }
}

TEST(CudaLinearGelu, MixedDtypesFallBackAndBadShapesNameTheArgument) {
  MCPP_REQUIRE_CUDA();
  // fp32 x with bf16 W: not one dtype, so no epilogue (the fallback's linear_fwd then rejects the mix).
  Tensor x = dev(rnd({16, 32}, 41)), w = dev(rnd({64, 32}, 42, DType::BF16), DType::BF16);
  Tensor act = Tensor::empty({16, 64}, DType::F32, Device::CUDA), pre = Tensor::empty({16, 64}, DType::F32, Device::CUDA);
  EXPECT_THROW(ops::linear_gelu_fwd(act, pre, x, w, nullptr), Error);
  Tensor wf = dev(rnd({64, 32}, 42)), pre_short = Tensor::empty({16, 60}, DType::F32, Device::CUDA);
  try {
    ops::linear_gelu_fwd(act, pre_short, x, wf, nullptr);
    FAIL() << "expected mcpp::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear_gelu_fwd: pre_act must have the shape of act"), std::string::npos)
        << e.what();
  }
  Tensor dy = dev(rnd({16, 64}, 43)), db_bf16 = Tensor::zeros({32}, DType::BF16, Device::CUDA);
  Tensor dpre = Tensor::empty({16, 32}, DType::F32, Device::CUDA), pre2 = dev(rnd({16, 32}, 44));
  try {
    ops::linear_dgelu_bwd(dpre, &db_bf16, dy, wf, pre2);
    FAIL() << "expected mcpp::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear_dgelu_bwd: db_acc"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mcpp
