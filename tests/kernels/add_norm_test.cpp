// The fused residual add + norm ops on the CPU backend (add_layernorm_fwd / add_rmsnorm_fwd,
// add_layernorm_bwd / add_rmsnorm_bwd) against the unfused composition they replace in the transformer
// layer: add then the norm (forward), the norm's backward then add_inplace (backward) — bit for bit,
// including the saved statistics and the accumulated dgamma / dbeta; with a residual dropout on the branch
// against the float64 mask formula. The CPU backend is float32 only (as every CPU op); bf16 is covered by
// tests/cuda/add_norm_test.cpp. Also: bad operands raise errors naming them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "core/core_test_util.h"
#include "kernels/grad_check.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {
namespace {
using namespace mcpp::testing;
namespace cpu = mcpp::ops::cpu;

::testing::AssertionResult bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return ::testing::AssertionFailure() << "shape/dtype differ";
  if (std::memcmp(a.raw(), b.raw(), a.nbytes()) != 0) {
    const float* pa = a.data<float>();
    const float* pb = b.data<float>();
    for (int64_t i = 0; i < a.numel(); ++i)
      if (std::memcmp(pa + i, pb + i, sizeof(float)) != 0)
        return ::testing::AssertionFailure() << "element " << i << ": " << pa[i] << " vs " << pb[i];
  }
  return ::testing::AssertionSuccess();
}

struct Case {
  int64_t n, h;
};

// Both norms, with and without beta; large enough for the OpenMP branches (n * h > 2^15, > 2^16).
TEST(AddNormCpu, ForwardEqualsAddThenNormBitwise) {
  for (const Case c : {Case{3, 5}, Case{37, 64}, Case{130, 768}}) {
    for (int kind = 0; kind < 3; ++kind) {  // 0: LayerNorm + beta, 1: LayerNorm, 2: RMSNorm
      SCOPED_TRACE(::testing::Message() << "n=" << c.n << " h=" << c.h << " kind=" << kind);
      const Tensor a = random_tensor({c.n, c.h}, 11, nullptr, -2.0, 3.0), b = random_tensor({c.n, c.h}, 12);
      const Tensor g = random_tensor({c.h}, 13, nullptr, 0.5, 1.5), beta = random_tensor({c.h}, 14);
      Tensor sum_ref = Tensor::empty({c.n, c.h}), y_ref = Tensor::empty({c.n, c.h});
      Tensor mean_ref = Tensor::zeros({c.n}), rstd_ref = Tensor::empty({c.n});
      Tensor sum = Tensor::empty({c.n, c.h}), y = Tensor::empty({c.n, c.h});
      Tensor mean = Tensor::zeros({c.n}), rstd = Tensor::empty({c.n});
      cpu::add(sum_ref, a, b, {});
      if (kind == 2) {
        cpu::rmsnorm_fwd(y_ref, rstd_ref, sum_ref, g, 1e-6f, {});
        cpu::add_rmsnorm_fwd(sum, y, rstd, a, b, g, 1e-6f, {}, {});
      } else {
        const Tensor* pb = kind == 0 ? &beta : nullptr;
        cpu::layernorm_fwd(y_ref, mean_ref, rstd_ref, sum_ref, g, pb, 1e-5f, {});
        cpu::add_layernorm_fwd(sum, y, mean, rstd, a, b, g, pb, 1e-5f, {}, {});
      }
      EXPECT_TRUE(bitwise_equal(sum, sum_ref));
      EXPECT_TRUE(bitwise_equal(y, y_ref));
      EXPECT_TRUE(bitwise_equal(mean, mean_ref));
      EXPECT_TRUE(bitwise_equal(rstd, rstd_ref));
    }
  }
}

TEST(AddNormCpu, BackwardEqualsNormBackwardThenAddBitwise) {
  for (const Case c : {Case{3, 5}, Case{37, 64}, Case{130, 768}}) {
    for (int kind = 0; kind < 3; ++kind) {
      SCOPED_TRACE(::testing::Message() << "n=" << c.n << " h=" << c.h << " kind=" << kind);
      const Tensor x = random_tensor({c.n, c.h}, 21, nullptr, -2.0, 3.0), g = random_tensor({c.h}, 22, nullptr, 0.5, 1.5);
      const Tensor dy = random_tensor({c.n, c.h}, 23), dres = random_tensor({c.n, c.h}, 24);
      Tensor y = Tensor::empty({c.n, c.h}), mean = Tensor::empty({c.n}), rstd = Tensor::empty({c.n});
      if (kind == 2) cpu::rmsnorm_fwd(y, rstd, x, g, 1e-6f, {});
      else cpu::layernorm_fwd(y, mean, rstd, x, g, nullptr, 1e-5f, {});
      // prior contents of the parameter grads: both must accumulate onto them
      Tensor dg_ref = random_tensor({c.h}, 25), db_ref = random_tensor({c.h}, 26);
      Tensor dg = dg_ref.clone(), db = db_ref.clone();
      Tensor dx_ref = Tensor::empty({c.n, c.h}), dx = Tensor::empty({c.n, c.h});
      if (kind == 2) {
        cpu::rmsnorm_bwd(dx_ref, dg_ref, dy, x, g, rstd, {});
        cpu::add_rmsnorm_bwd(dx, dg, dy, dres, x, g, rstd, nullptr, nullptr, {}, nullptr, {});
      } else {
        cpu::layernorm_bwd(dx_ref, dg_ref, kind == 0 ? &db_ref : nullptr, dy, x, g, mean, rstd, {});
        cpu::add_layernorm_bwd(dx, dg, kind == 0 ? &db : nullptr, dy, dres, x, g, mean, rstd, nullptr, nullptr, {},
                               nullptr, {});
      }
      cpu::add_inplace(dx_ref, dres, {});
      EXPECT_TRUE(bitwise_equal(dx, dx_ref));
      EXPECT_TRUE(bitwise_equal(dg, dg_ref));
      EXPECT_TRUE(bitwise_equal(db, db_ref));
      // and the residual really is added: dx - dres equals the plain backward's dx (to fp32 rounding)
      const float* p = dx.data<float>();
      const float* r = dres.data<float>();
      Tensor plain = Tensor::empty({c.n, c.h}), dg2 = Tensor::zeros({c.h});
      if (kind == 2) cpu::rmsnorm_bwd(plain, dg2, dy, x, g, rstd, {});
      else cpu::layernorm_bwd(plain, dg2, nullptr, dy, x, g, mean, rstd, {});
      for (int64_t i = 0; i < dx.numel(); ++i) ASSERT_NEAR(p[i] - r[i], plain.data<float>()[i], 1e-5) << i;
    }
  }
}

// The residual bias sums (dres_sum_acc / dx_sum_acc): accumulate the column sums of dres and of the fused
// dx — bitwise linear_bwd's bias grad over those tensors, and within fp32 rounding of a float64 sum.
TEST(AddNormCpu, ResidualBiasSumsAreLinearBwdsColumnSums) {
  for (const Case c : {Case{3, 5}, Case{130, 768}}) {
    for (int kind = 0; kind < 3; ++kind) {
      SCOPED_TRACE(::testing::Message() << "n=" << c.n << " h=" << c.h << " kind=" << kind);
      const Tensor x = random_tensor({c.n, c.h}, 31, nullptr, -2.0, 3.0);
      const Tensor g = random_tensor({c.h}, 32, nullptr, 0.5, 1.5);
      const Tensor dy = random_tensor({c.n, c.h}, 33), dres = random_tensor({c.n, c.h}, 34);
      Tensor y = Tensor::empty({c.n, c.h}), mean = Tensor::empty({c.n}), rstd = Tensor::empty({c.n});
      if (kind == 2) cpu::rmsnorm_fwd(y, rstd, x, g, 1e-6f, {});
      else cpu::layernorm_fwd(y, mean, rstd, x, g, nullptr, 1e-5f, {});
      Tensor dg = Tensor::zeros({c.h}), db = Tensor::zeros({c.h}), dx = Tensor::empty({c.n, c.h});
      const Tensor prior_r = random_tensor({c.h}, 35), prior_d = random_tensor({c.h}, 36);
      Tensor sum_r = prior_r.clone(), sum_d = prior_d.clone();  // must accumulate onto these
      if (kind == 2) cpu::add_rmsnorm_bwd(dx, dg, dy, dres, x, g, rstd, &sum_r, &sum_d, {}, nullptr, {});
      else
        cpu::add_layernorm_bwd(dx, dg, kind == 0 ? &db : nullptr, dy, dres, x, g, mean, rstd, &sum_r, &sum_d, {},
                               nullptr, {});
      // linear_bwd's bias grad over the same tensors (a linear with in = 1: only db is looked at)
      Tensor ones = Tensor::zeros({c.n, 1}), w = Tensor::zeros({c.h, 1}), dw = Tensor::zeros({c.h, 1});
      Tensor lin_r = prior_r.clone(), lin_d = prior_d.clone();
      cpu::linear_bwd(nullptr, dw, &lin_r, dres, ones, w, ops::GradWrite::Accumulate, {});
      cpu::linear_bwd(nullptr, dw, &lin_d, dx, ones, w, ops::GradWrite::Accumulate, {});
      EXPECT_TRUE(bitwise_equal(sum_r, lin_r));
      EXPECT_TRUE(bitwise_equal(sum_d, lin_d));
      for (int64_t j = 0; j < c.h; ++j) {  // float64 oracle
        double r = prior_r.data<float>()[j], d = prior_d.data<float>()[j];
        for (int64_t i = 0; i < c.n; ++i) r += dres.data<float>()[i * c.h + j], d += dx.data<float>()[i * c.h + j];
        ASSERT_NEAR(sum_r.data<float>()[j], r, 1e-5 * (1 + std::abs(r))) << j;
        ASSERT_NEAR(sum_d.data<float>()[j], d, 1e-5 * (1 + std::abs(d))) << j;
      }
    }
  }
  // a sum accumulator of the wrong size is named
  Tensor x = random_tensor({2, 8}, 1), g = random_tensor({8}, 2), m = Tensor::empty({2}), r = Tensor::empty({2});
  Tensor y = Tensor::empty({2, 8}), dx = Tensor::empty({2, 8}), dg = Tensor::zeros({8}), bad = Tensor::zeros({7});
  cpu::layernorm_fwd(y, m, r, x, g, nullptr, 1e-5f, {});
  try {
    cpu::add_layernorm_bwd(dx, dg, nullptr, x, y, x, g, m, r, nullptr, &bad, {}, nullptr, {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dx_sum_acc"), std::string::npos) << e.what();
  }
}

// Residual dropout (bias-dropout-add): the forward adds b's dropout — element i kept iff
// philox_uniform_at(key, i) >= p, scaled by 1 / (1 - p) (float64 formula, and bitwise dropout_fwd, then the op
// without dropout); the backward's dx is the op's without dropout and dbranch = keep(i) dx / (1 - p), whose
// column sums go to dx_sum_acc (bitwise linear_bwd's bias grad over dbranch).
TEST(AddNormCpu, ResidualDropoutDropsTheBranchAndReturnsItsGradient) {
  const int64_t n = 37, h = 64;
  const float p = 0.25f;
  const PhiloxKey key{.seed = 5, .offset = 9};
  for (int kind = 0; kind < 2; ++kind) {  // 0: LayerNorm + beta, 1: RMSNorm
    SCOPED_TRACE(::testing::Message() << "kind=" << kind);
    const Tensor a = random_tensor({n, h}, 21, nullptr, -2.0, 3.0), b = random_tensor({n, h}, 22);
    const Tensor g = random_tensor({h}, 23, nullptr, 0.5, 1.5), beta = random_tensor({h}, 24);
    auto fwd = [&](Tensor& sum, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& branch,
                   const ops::ResidualDropout& d) {
      if (kind == 1) cpu::add_rmsnorm_fwd(sum, y, rstd, a, branch, g, 1e-6f, d, {});
      else cpu::add_layernorm_fwd(sum, y, mean, rstd, a, branch, g, &beta, 1e-5f, d, {});
    };
    Tensor sum = Tensor::empty({n, h}), y = Tensor::empty({n, h}), mean = Tensor::zeros({n}), rstd = Tensor::empty({n});
    fwd(sum, y, mean, rstd, b, {p, key});
    Tensor dropped = Tensor::empty({n, h}), sum_u = Tensor::empty({n, h}), y_u = Tensor::empty({n, h});
    Tensor mean_u = Tensor::zeros({n}), rstd_u = Tensor::empty({n});
    cpu::dropout_fwd(dropped, b, p, key, {});
    fwd(sum_u, y_u, mean_u, rstd_u, dropped, {});
    EXPECT_TRUE(bitwise_equal(sum, sum_u));
    EXPECT_TRUE(bitwise_equal(y, y_u));
    EXPECT_TRUE(bitwise_equal(rstd, rstd_u));
    int64_t kept = 0;
    for (int64_t i = 0; i < n * h; ++i) {
      const bool keep = philox_uniform_at(key, static_cast<uint64_t>(i)) >= p;
      kept += keep;
      const double want = a.data<float>()[i] + (keep ? b.data<float>()[i] / (1.0 - p) : 0.0);
      ASSERT_NEAR(sum.data<float>()[i], want, 1e-6 * (1 + std::abs(want))) << i;
    }
    EXPECT_GT(kept, 0);
    EXPECT_LT(kept, n * h);
    const Tensor dy = random_tensor({n, h}, 25), dres = random_tensor({n, h}, 26);
    Tensor dx = Tensor::empty({n, h}), dbranch = Tensor::empty({n, h}), dx_u = Tensor::empty({n, h});
    Tensor dg = Tensor::zeros({h}), db = Tensor::zeros({h}), sr = Tensor::zeros({h}), sd = Tensor::zeros({h});
    Tensor dg_u = Tensor::zeros({h}), db_u = Tensor::zeros({h});
    const ops::ResidualDropout drop{p, key};
    if (kind == 1) {
      cpu::add_rmsnorm_bwd(dx, dg, dy, dres, sum, g, rstd, &sr, &sd, drop, &dbranch, {});
      cpu::add_rmsnorm_bwd(dx_u, dg_u, dy, dres, sum, g, rstd, nullptr, nullptr, {}, nullptr, {});
    } else {
      cpu::add_layernorm_bwd(dx, dg, &db, dy, dres, sum, g, mean, rstd, &sr, &sd, drop, &dbranch, {});
      cpu::add_layernorm_bwd(dx_u, dg_u, &db_u, dy, dres, sum, g, mean, rstd, nullptr, nullptr, {}, nullptr, {});
    }
    EXPECT_TRUE(bitwise_equal(dx, dx_u));
    EXPECT_TRUE(bitwise_equal(dg, dg_u));
    for (int64_t i = 0; i < n * h; ++i) {
      const bool keep = philox_uniform_at(key, static_cast<uint64_t>(i)) >= p;
      const double want = keep ? dx.data<float>()[i] / (1.0 - p) : 0.0;
      ASSERT_NEAR(dbranch.data<float>()[i], want, 1e-6 * (1 + std::abs(want))) << i;
    }
    Tensor ones = Tensor::zeros({n, 1}), w = Tensor::zeros({h, 1}), dw = Tensor::zeros({h, 1});
    Tensor lin_r = Tensor::zeros({h}), lin_d = Tensor::zeros({h});
    cpu::linear_bwd(nullptr, dw, &lin_r, dres, ones, w, ops::GradWrite::Accumulate, {});
    cpu::linear_bwd(nullptr, dw, &lin_d, dbranch, ones, w, ops::GradWrite::Accumulate, {});
    EXPECT_TRUE(bitwise_equal(sr, lin_r));
    EXPECT_TRUE(bitwise_equal(sd, lin_d));
  }
}

TEST(AddNormCpu, BadOperandsNameTheField) {
  const int64_t n = 4, h = 8;
  Tensor a = random_tensor({n, h}, 1), b = random_tensor({n, h}, 2), b_bad = random_tensor({n, h + 1}, 3);
  Tensor g = random_tensor({h}, 4), sum = Tensor::empty({n, h}), y = Tensor::empty({n, h});
  Tensor mean = Tensor::empty({n}), rstd = Tensor::empty({n});
  EXPECT_NE(error_of([&] { cpu::add_layernorm_fwd(sum, y, mean, rstd, a, b_bad, g, nullptr, 1e-5f, {}, {}); })
                .find("add_layernorm_fwd: b must have the shape of sum"),
            std::string::npos);
  EXPECT_NE(error_of([&] { cpu::add_rmsnorm_fwd(sum, y, rstd, b_bad, b, g, 1e-5f, {}, {}); })
                .find("add_rmsnorm_fwd: a must have the shape of sum"),
            std::string::npos);
  cpu::layernorm_fwd(y, mean, rstd, a, g, nullptr, 1e-5f, {});
  Tensor dx = Tensor::empty({n, h}), dg = Tensor::zeros({h});
  EXPECT_NE(error_of([&] {
              cpu::add_layernorm_bwd(dx, dg, nullptr, b, b_bad, a, g, mean, rstd, nullptr, nullptr, {}, nullptr, {});
            })
                .find("add_layernorm_bwd: dres must have the shape of x"),
            std::string::npos);
  EXPECT_NE(error_of([&] { cpu::add_rmsnorm_bwd(dx, dg, b, dx, a, g, rstd, nullptr, nullptr, {}, nullptr, {}); })
                .find("dres must not alias dx"),
            std::string::npos);
  // residual dropout: the probability's range, dbranch present and not aliasing an operand
  const ops::ResidualDropout drop{0.1f, PhiloxKey{1, 2}};
  EXPECT_NE(error_of([&] { cpu::add_rmsnorm_fwd(sum, y, rstd, a, b, g, 1e-5f, {1.5f, {}}, {}); })
                .find("add_rmsnorm_fwd: residual dropout probability p must be in [0, 1]"),
            std::string::npos);
  Tensor dres = random_tensor({n, h}, 5), dbranch = Tensor::empty({n, h});
  EXPECT_NE(error_of([&] { cpu::add_layernorm_bwd(dx, dg, nullptr, b, dres, a, g, mean, rstd, nullptr, nullptr, drop,
                                                  nullptr, {}); })
                .find("add_layernorm_bwd: a residual dropout needs dbranch"),
            std::string::npos);
  EXPECT_NE(error_of([&] { cpu::add_rmsnorm_bwd(dx, dg, b, dres, a, g, rstd, nullptr, nullptr, drop, &dres, {}); })
                .find("add_rmsnorm_bwd: dbranch must not alias dx, dy, dres or x"),
            std::string::npos);
  cpu::add_rmsnorm_bwd(dx, dg, b, dres, a, g, rstd, nullptr, nullptr, drop, &dbranch, {});  // well formed
}

}  // namespace
}  // namespace mcpp
