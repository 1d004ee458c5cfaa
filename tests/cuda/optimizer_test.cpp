// CUDA AdamW, sum_of_squares and has_non_finite vs the CPU backend.
#include <limits>

#include "cuda/cuda_test_util.h"

namespace mcpp {
namespace {
using namespace cuda_test;

TEST(CudaAdamW, ThreeStepsMatchCpuAndWriteBf16Model) {
  MCPP_REQUIRE_CUDA();
  const int64_t n = 10007;
  Tensor p_ref = rnd({n}, 1), m_ref = Tensor::zeros({n}), v_ref = Tensor::zeros({n});
  Tensor p = dev(p_ref), m = dev(m_ref), v = dev(v_ref), model = poisoned({n}, DType::BF16);
  Tensor model_ref = Tensor::empty({n}, DType::BF16);
  for (int64_t step = 1; step <= 3; ++step) {
    Tensor g = rnd({n}, 10 + static_cast<uint64_t>(step), DType::F32, -0.1, 0.1);
    const ops::AdamWOptions opt{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                                .step = step};
    ops::cpu::adamw_step(p_ref, m_ref, v_ref, g, &model_ref, opt, {});
    ops::adamw_step(p, m, v, dev(g), &model, opt);
  }
  // same float32 operation order; only FMA contraction on the GPU differs: ~1 ulp
  EXPECT_REL(host(p), p_ref, 1e-6);
  EXPECT_REL(host(m), m_ref, 1e-6);
  EXPECT_REL(host(v), v_ref, 1e-6);
  EXPECT_REL(host(model), model_ref.to(DType::F32), 4e-3);  // bf16 copy: one rounding (ties may differ)
}

TEST(CudaReductions, SumOfSquaresAndNonFinite) {
  MCPP_REQUIRE_CUDA();
  Tensor x = rnd({1000003}, 2);
  Tensor xd = dev(x);
  const double want = ops::cpu::sum_of_squares(x, {});
  const double got = ops::sum_of_squares(xd);
  EXPECT_NEAR(got, want, 1e-10 * want);  // float64 accumulation both sides, different order
  EXPECT_EQ(ops::sum_of_squares(xd), got);  // deterministic: fixed reduction tree
  EXPECT_FALSE(ops::has_non_finite(xd));
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    Tensor y = x.clone();
    y.data<float>()[777777] = bad;
    EXPECT_TRUE(ops::has_non_finite(dev(y)));
    EXPECT_TRUE(ops::cpu::has_non_finite(y, {}));
  }
}

}  // namespace
}  // namespace mcpp
