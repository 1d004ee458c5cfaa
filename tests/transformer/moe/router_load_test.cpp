// The routers' expert-load statistics (moe/router.h LossTracker::add_load, the trainer's MoE load report): per layer
// the routes per expert and the kept routes (counted here from the routing's topk / idx on the host) and the entropy
// of softmax(logits) summed over the tokens (float64 from x W_r^T here), for softmax and sigmoid routers, dropless and
// at a capacity; the sums accumulate over calls and take_load() resets them; evaluation adds nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/grad_check.h"
#include "mcpp/distributed/param_and_grad_buffer.h"
#include "mcpp/transformer/moe/moe_layer.h"
#include "models/gpt_test_util.h"

namespace mcpp {
namespace {

TEST(RouterLoad, RoutesKeptAndEntropyMatchADirectCount) {
  for (const char* score : {"softmax", "sigmoid"})
    for (const double capacity : {0.0, 0.5}) {
      SCOPED_TRACE(::testing::Message() << score << " capacity " << capacity);
      TransformerConfig c = testing::tiny_config("gpt2");
      c.num_moe_experts = 4;
      c.moe_router_topk = 2;
      c.moe_router_score_function = score;
      c.moe_expert_capacity_factor = capacity;
      c.finalize();
      c.validate();
      ParamAndGradBuffer params;
      moe::MoELayer layer(params, params, "mlp", c, testing::single_tp());
      params.finalize(3);
      const int64_t e = 4, k = 2, h = c.hidden_size, n = 12;
      const Tensor x = testing::random_tensor({6, 2, h}, 9);
      moe::LossTracker tracker(1);
      moe::MoELayerCtx eval;
      layer.forward(eval, x, nullptr);  // evaluation: nothing recorded
      moe::MoELayerCtx ctx;
      layer.forward(ctx, x, &tracker);
      // the expectations from this call's routing (host copies)
      std::vector<double> routes(e, 0.0), kept(e, 0.0);
      const int32_t* topk = ctx.router.topk.data<int32_t>();
      const int32_t* idx = ctx.router.idx.data<int32_t>();
      for (int64_t i = 0; i < n * k; ++i) {
        routes[static_cast<size_t>(topk[i])] += 1;
        if (idx[i] >= 0) kept[static_cast<size_t>(topk[i])] += 1;
      }
      const float* w = layer.router().weight()->data.data<float>();  // [E, h]
      const float* xs = x.data<float>();                             // [n, h]
      double entropy = 0.0;
      for (int64_t t = 0; t < n; ++t) {
        std::vector<double> logit(e, 0.0);
        double mx = -1e300;
        for (int64_t j = 0; j < e; ++j) {
          for (int64_t q = 0; q < h; ++q) logit[j] += static_cast<double>(xs[t * h + q]) * w[j * h + q];
          mx = std::max(mx, logit[j]);
        }
        double z = 0.0;
        for (double l : logit) z += std::exp(l - mx);
        for (double l : logit) {
          const double p = std::exp(l - mx) / z;
          entropy -= p * std::log(p);
        }
      }
      layer.forward(ctx, x, &tracker);  // a second microbatch: the sums double
      const std::vector<std::vector<double>> load = tracker.take_load();
      ASSERT_EQ(load.size(), 1u);
      ASSERT_EQ(load[0].size(), static_cast<size_t>(2 * e + 2));
      for (int64_t j = 0; j < e; ++j) {
        EXPECT_EQ(load[0][static_cast<size_t>(j)], 2 * routes[static_cast<size_t>(j)]) << "expert " << j;
        EXPECT_EQ(load[0][static_cast<size_t>(e + j)], 2 * kept[static_cast<size_t>(j)]) << "expert " << j;
      }
      if (capacity > 0) {
        double r = 0, kk = 0;
        for (int64_t j = 0; j < e; ++j) r += routes[static_cast<size_t>(j)], kk += kept[static_cast<size_t>(j)];
        EXPECT_LE(kk, 0.5 * r + e);  // at most ceil(n k / E * 0.5) kept per expert
      }
      // float32 GEMMs over n x E products of |logit| ~ 1 against float64: 1e-4 relative
      EXPECT_NEAR(load[0][static_cast<size_t>(2 * e)], 2 * entropy, 1e-4 * 2 * entropy);
      EXPECT_EQ(load[0][static_cast<size_t>(2 * e + 1)], 2.0 * n);
      EXPECT_EQ(tracker.take_load()[0], std::vector<double>(2 * e + 2, 0.0));  // taken: reset
    }
}

}  // namespace
}  // namespace mcpp
