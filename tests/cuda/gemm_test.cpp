// CUDA GEMM / linear (cuBLASLt) vs the CPU backend (OpenBLAS sgemm) on the same inputs.
#include <cstring>

#include "cuda/cuda_test_util.h"
#include "mcpp/kernels/gemm_autotune.h"

namespace mcpp {
namespace {
using namespace cuda_test;

TEST(CudaGemm, AllTransposesAlphaBetaMatchCpu) {
  MCPP_REQUIRE_CUDA();
  const int64_t m = 67, n = 45, k = 129;  // odd sizes: no tile-multiple shortcuts
  for (DType dt : float_dtypes()) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " trans_a=" << ta << " trans_b=" << tb);
        Tensor a = rnd(ta ? Shape{k, m} : Shape{m, k}, 1, dt), b = rnd(tb ? Shape{n, k} : Shape{k, n}, 2, dt);
        Tensor c = rnd({m, n}, 3);
        const ops::GemmOptions opt{.trans_a = ta == 1, .trans_b = tb == 1, .alpha = 1.5f, .beta = 0.5f};
        Tensor want = c.clone();
        ops::cpu::gemm(want, a, b, opt, {});
        Tensor cd = dev(c);  // fp32 C: bf16 inputs accumulate in fp32 into it
        ops::gemm(cd, dev(a, dt), dev(b, dt), opt);
        // fp32 accumulate in both; only the summation order differs (k = 129): 1e-5 relative.
        EXPECT_REL(host(cd), want, 1e-5);
      }
    }
  }
}

TEST(CudaGemm, Bf16OutputRoundsOnce) {
  MCPP_REQUIRE_CUDA();
  Tensor a = rnd({64, 96}, 4, DType::BF16), b = rnd({96, 80}, 5, DType::BF16);
  Tensor want = Tensor::empty({64, 80});
  ops::cpu::gemm(want, a, b, {}, {});
  Tensor c = poisoned({64, 80}, DType::BF16);
  ops::gemm(c, dev(a, DType::BF16), dev(b, DType::BF16), {});
  EXPECT_REL(host(c), want, 4e-3);  // one bf16 rounding of the fp32 result: <= 2^-9 per element
}

TEST(CudaLinear, ForwardWithBiasEpilogueAndBackwardAccumulates) {
  MCPP_REQUIRE_CUDA();
  const int64_t s = 5, b = 3, in = 96, out = 80;
  for (DType dt : float_dtypes()) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = rnd({s, b, in}, 10, dt), w = rnd({out, in}, 11, dt), bias = rnd({out}, 12, dt);
    Tensor y_ref = Tensor::empty({s, b, out});
    ops::cpu::linear_fwd(y_ref, x, w, &bias, {});
    Tensor y = poisoned({s, b, out}, dt);
    Tensor biasd = dev(bias, dt);
    ops::linear_fwd(y, dev(x, dt), dev(w, dt), &biasd);
    EXPECT_REL(host(y), y_ref, tol(dt, 1e-5, 4e-3));

    Tensor dy = rnd({s, b, out}, 13, dt);
    Tensor dx_ref = Tensor::empty({s, b, in}), dw_ref = rnd({out, in}, 14), db_ref = rnd({out}, 15);
    Tensor dw = dev(dw_ref), db = dev(db_ref);  // fp32 main grads with prior contents: must accumulate
    ops::cpu::linear_bwd(&dx_ref, dw_ref, &db_ref, dy, x, w, ops::GradWrite::Accumulate, {});
    Tensor dx = poisoned({s, b, in}, dt);
    ops::linear_bwd(&dx, dw, &db, dev(dy, dt), dev(x, dt), dev(w, dt), ops::GradWrite::Accumulate);
    EXPECT_REL(host(dx), dx_ref, tol(dt, 1e-5, 4e-3));
    EXPECT_REL(host(dw), dw_ref, 1e-5);  // fp32 accumulate into fp32 for both dtypes
    EXPECT_REL(host(db), db_ref, 1e-5);
  }
}

// The bias grad of linear_bwd rides in the weight-grad GEMM (BGRADB epilogue): at a training-sized n it
// must match the CPU, accumulate into the fp32 main grad, and be bit-identical run to run (the atomic
// column-sum fallback would not be at this n).
TEST(CudaLinear, BiasGradInWgradGemmIsDeterministicAtTrainingShapes) {
  MCPP_REQUIRE_CUDA();
  const int64_t n = 8192, in = 256, out = 768;
  for (DType dt : float_dtypes()) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = rnd({n, in}, 20, dt), w = rnd({out, in}, 21, dt), dy = rnd({n, out}, 22, dt);
    Tensor dw_ref = rnd({out, in}, 23), db_ref = rnd({out}, 24);
    Tensor dw0 = dw_ref.clone(), db0 = db_ref.clone();
    ops::cpu::linear_bwd(nullptr, dw_ref, &db_ref, dy, x, w, ops::GradWrite::Accumulate, {});
    Tensor xd = dev(x, dt), wd = dev(w, dt), dyd = dev(dy, dt);
    Tensor first;
    for (int run = 0; run < 2; ++run) {
      Tensor dw = dev(dw0), db = dev(db0);
      ops::linear_bwd(nullptr, dw, &db, dyd, xd, wd, ops::GradWrite::Accumulate);
      Tensor dbh = host(db);
      EXPECT_REL(host(dw), dw_ref, 1e-5);
      EXPECT_REL(dbh, db_ref, 1e-5);
      if (run == 0) first = dbh;
      else EXPECT_EQ(std::memcmp(first.raw(), dbh.raw(), dbh.nbytes()), 0) << "db differs between runs";
    }
  }
}

// GradWrite::Overwrite (the step's first write into a stale main grad): dw through a beta = 0 wgrad GEMM,
// db through BGRADB straight into it (16-byte aligned) or a scratch + copy (not aligned: db at an odd
// offset of its buffer), or the split GEMM + column sum; all over NaN-filled outputs, against the CPU's
// accumulation into zeros.
TEST(CudaLinear, OverwriteWritesTheGradsWithoutReadingThem) {
  MCPP_REQUIRE_CUDA();
  const ops::cuda::BiasGradPath saved = ops::cuda::bias_grad_path();
  for (int64_t n : {int64_t{96}, int64_t{8192}}) {
    for (auto path : {ops::cuda::BiasGradPath::kAuto, ops::cuda::BiasGradPath::kSplit}) {
      for (int64_t db_offset : {0, 1}) {
        for (DType dt : float_dtypes()) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " n " << n << " split "
                                            << (path == ops::cuda::BiasGradPath::kSplit) << " db offset " << db_offset);
          ops::cuda::set_bias_grad_path(path);
          const int64_t in = 256, out = 768;
          Tensor x = rnd({n, in}, 30, dt), w = rnd({out, in}, 31, dt), dy = rnd({n, out}, 32, dt);
          Tensor dw_ref = Tensor::zeros({out, in}), db_ref = Tensor::zeros({out});
          ops::cpu::linear_bwd(nullptr, dw_ref, &db_ref, dy, x, w, ops::GradWrite::Accumulate, {});
          Tensor dw = poisoned({out, in}, DType::F32);
          Tensor db_buf = poisoned({out + 1}, DType::F32);
          Tensor db = db_buf.flat_slice(db_offset, {out});
          ops::linear_bwd(nullptr, dw, &db, dev(dy, dt), dev(x, dt), dev(w, dt), ops::GradWrite::Overwrite);
          EXPECT_REL(host(dw), dw_ref, 1e-5);
          EXPECT_REL(host(db), db_ref, 1e-5);
        }
      }
    }
  }
  ops::cuda::set_bias_grad_path(saved);
}

TEST(CudaLinear, RejectsMismatchedShapesWithNamedError) {
  MCPP_REQUIRE_CUDA();
  Tensor x = Tensor::zeros({4, 8}, DType::F32, Device::CUDA), w = Tensor::zeros({6, 7}, DType::F32, Device::CUDA);
  Tensor y = Tensor::zeros({4, 6}, DType::F32, Device::CUDA);
  try {
    ops::linear_fwd(y, x, w, nullptr);
    FAIL() << "expected mcpp::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear_fwd: x must be [.., in=7]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mcpp
