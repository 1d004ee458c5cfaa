// Tests for ops::cpu::scaled_masked_softmax_fwd / _bwd: forward vs a float64 softmax (causal and not),
// masked entries exactly 0, backward vs central finite differences of the float64 forward, and the
// sq != sk rejection for the causal mask.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/grad_check.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {
namespace {

// probs[rows, sq, sk] = softmax_k(scale * scores) with keys j > i masked when causal, in float64.
std::vector<double> softmax_ref(const std::vector<double>& x, int64_t rows, int64_t sq, int64_t sk, double scale,
                                bool causal) {
  std::vector<double> p(x.size(), 0.0);
  for (int64_t r = 0; r < rows * sq; ++r) {
    const int64_t valid = causal ? r % sq + 1 : sk;
    double mx = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < valid; ++j) mx = std::max(mx, scale * x[r * sk + j]);
    for (int64_t j = 0; j < valid; ++j) sum += (p[r * sk + j] = std::exp(scale * x[r * sk + j] - mx));
    for (int64_t j = 0; j < valid; ++j) p[r * sk + j] /= sum;
  }
  return p;
}

TEST(ScaledMaskedSoftmaxCpu, ForwardMatchesFloat64) {
  for (bool causal : {true, false})
    for (auto [sq, sk] : {std::pair<int64_t, int64_t>{1, 1}, {17, 17}, {40, 40}, {5, 33}}) {
      if (causal && sq != sk) continue;
      SCOPED_TRACE("sq=" + std::to_string(sq) + " sk=" + std::to_string(sk) + (causal ? " causal" : ""));
      const int64_t rows = 3;
      const float scale = 0.37f;
      std::vector<double> xs;
      // Scores up to +-40 so scale * x spans ~30: exercises the max subtraction.
      Tensor x = testing::random_tensor({rows, sq, sk}, 5, &xs, -40.0, 40.0);
      Tensor p = Tensor::empty(x.shape());
      p.fill_(NAN);
      ops::cpu::scaled_masked_softmax_fwd(p, x, scale, causal, {});
      const std::vector<double> want = softmax_ref(xs, rows, sq, sk, scale, causal);
      // Probabilities in [0, 1]; fp32 exp and sum over <= 40 terms: ~1e-7 absolute.
      EXPECT_LT(testing::max_abs_error(testing::to_doubles(p), want), 1e-6);
      if (causal) {
        const float* pp = p.data<float>();
        for (int64_t r = 0; r < rows * sq; ++r)
          for (int64_t j = r % sq + 1; j < sk; ++j) ASSERT_EQ(pp[r * sk + j], 0.0f) << "row " << r << " key " << j;
      }
    }
}

TEST(ScaledMaskedSoftmaxCpu, BackwardMatchesFiniteDifferences) {
  for (bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    const int64_t rows = 2, sq = 6, sk = 6;
    const float scale = 1.7f;
    std::vector<double> xs, dps;
    Tensor x = testing::random_tensor({rows, sq, sk}, 8, &xs, -2.0, 2.0);
    Tensor dp = testing::random_tensor({rows, sq, sk}, 9, &dps);
    Tensor p = Tensor::empty(x.shape()), dx = Tensor::empty(x.shape());
    ops::cpu::scaled_masked_softmax_fwd(p, x, scale, causal, {});
    dx.fill_(NAN);  // overwritten
    ops::cpu::scaled_masked_softmax_bwd(dx, dp, p, scale, {});
    const std::vector<double> want = testing::numeric_grad(
        [&](const std::vector<double>& v) { return testing::dot(dps, softmax_ref(v, rows, sq, sk, scale, causal)); },
        xs);
    // Grads O(0.1-1); fp32 products of O(1) terms: 1e-5 absolute; FD error ~1e-9 (grad_check.h).
    EXPECT_LT(testing::max_abs_error(testing::to_doubles(dx), want), 1e-5);
  }
}

TEST(ScaledMaskedSoftmaxCpu, BackwardInPlaceOverDprobs) {
  std::vector<double> xs;
  Tensor x = testing::random_tensor({2, 9, 9}, 3, &xs);
  Tensor dp = testing::random_tensor({2, 9, 9}, 4);
  Tensor p = Tensor::empty(x.shape()), dx = Tensor::empty(x.shape());
  ops::cpu::scaled_masked_softmax_fwd(p, x, 0.5f, true, {});
  ops::cpu::scaled_masked_softmax_bwd(dx, dp, p, 0.5f, {});
  ops::cpu::scaled_masked_softmax_bwd(dp, dp, p, 0.5f, {});  // dscores aliases dprobs
  EXPECT_EQ(testing::to_doubles(dp), testing::to_doubles(dx));
}

TEST(ScaledMaskedSoftmaxCpu, CausalNeedsSquareScores) {
  Tensor x = Tensor::zeros({1, 4, 6}), p = Tensor::empty({1, 4, 6});
  try {
    ops::cpu::scaled_masked_softmax_fwd(p, x, 1.0f, true, {});
    FAIL() << "causal with sq != sk must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sq == sk"), std::string::npos) << e.what();
  }
  Tensor wrong = Tensor::empty({1, 4, 5});
  EXPECT_THROW(ops::cpu::scaled_masked_softmax_fwd(wrong, x, 1.0f, false, {}), Error);
}

}  // namespace
}  // namespace mcpp
