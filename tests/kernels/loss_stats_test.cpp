// masked_loss_stats / masked_loss_grad (CPU): the statistics equal a float64 sum in index order (stored
// float32); the gradient is mask * float(grad_scale / count) — what the model computed on the host before
// the statistics moved to the device — or mask * grad_scale per token; no tokens give a zero gradient;
// wrong shapes name the argument.
#include <gtest/gtest.h>

#include <string>

#include "kernels/grad_check.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {
namespace {

Tensor mask_of(int64_t n, int every) {  // 1 except every `every`-th token
  Tensor m = Tensor::empty({n});
  for (int64_t i = 0; i < n; ++i) m.data<float>()[i] = (i % every == 0) ? 0.0f : 1.0f;
  return m;
}

TEST(MaskedLossCpu, StatsAreTheFloat64MaskedSums) {
  const int64_t n = 4099;
  Tensor loss = testing::random_tensor({n}, 7, nullptr, 0.0, 11.0);
  Tensor mask = mask_of(n, 3);
  Tensor stats = Tensor::empty({2});
  ops::masked_loss_stats(stats, loss, mask);
  double sum = 0, count = 0;
  for (int64_t i = 0; i < n; ++i) {
    sum += static_cast<double>(loss.data<float>()[i]) * mask.data<float>()[i];
    count += mask.data<float>()[i];
  }
  EXPECT_EQ(stats.data<float>()[0], static_cast<float>(sum));
  EXPECT_EQ(stats.data<float>()[1], static_cast<float>(count));
  EXPECT_EQ(stats.data<float>()[1], 2732.0f);  // 4099 - ceil(4099 / 3)
}

TEST(MaskedLossCpu, GradIsMaskTimesTheMeanCoefficient) {
  const int64_t n = 1000;
  Tensor mask = mask_of(n, 4);
  Tensor stats = Tensor::empty({2});
  stats.data<float>()[0] = 1234.5f;
  stats.data<float>()[1] = 750.0f;
  Tensor dloss = Tensor::empty({n});
  ops::masked_loss_grad(dloss, mask, stats, 0.25f, /*per_token=*/false);
  const auto coef = static_cast<float>(0.25f / 750.0);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(dloss.data<float>()[i], mask.data<float>()[i] * coef) << i;
  ops::masked_loss_grad(dloss, mask, stats, 0.25f, /*per_token=*/true);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(dloss.data<float>()[i], mask.data<float>()[i] * 0.25f) << i;
  stats.data<float>()[1] = 0.0f;  // every token masked: no gradient, not a division by zero
  ops::masked_loss_grad(dloss, mask, stats, 0.25f, /*per_token=*/false);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(dloss.data<float>()[i], 0.0f) << i;
}

TEST(MaskedLossCpu, WrongShapesNameTheArgument) {
  Tensor loss = Tensor::zeros({8}), mask = Tensor::zeros({8}), stats = Tensor::zeros({2});
  Tensor short_mask = Tensor::zeros({7}), bad_stats = Tensor::zeros({3});
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message([&] { ops::masked_loss_stats(stats, loss, short_mask); }).find("mask"), std::string::npos);
  EXPECT_NE(message([&] { ops::masked_loss_stats(bad_stats, loss, mask); }).find("stats"), std::string::npos);
  Tensor dloss = Tensor::zeros({7});
  EXPECT_NE(message([&] { ops::masked_loss_grad(dloss, mask, stats, 1.0f, false); }).find("dloss"),
            std::string::npos);
}

}  // namespace
}  // namespace mcpp
