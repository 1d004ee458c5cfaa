// Grouped-GEMM experts on CPU (--moe-grouped-gemm; transformer/moe/grouped_mlp.h, ops.inc grouped_linear_*):
//   - the grouped ops against a direct float64 definition (per group: y = x W^T + b, dx = dy W, dW (+)= dy^T x,
//     db (+)= sum dy) with groups of uneven and zero rows, accumulate and overwrite;
//   - an MoELayer with moe_grouped_gemm against the same layer with SequentialMLP (the same parameters): the output,
//     the input gradient and every main grad bitwise equal (the CPU grouped ops run the per-expert GEMMs), GELU with
//     biases and SwiGLU without, experts without tokens (zero grads, every parameter reported ready once), recompute
//     "moe_act";
//   - the flag parses, and the captured step accepts dropless MoE only with it (the counts stay on the device).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/core_test_util.h"
#include "kernels/grad_check.h"
#include "mcpp/core/error.h"
#include "mcpp/distributed/param_and_grad_buffer.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/training/arguments.h"
#include "mcpp/transformer/moe/moe_layer.h"
#include "models/gpt_test_util.h"
#include "training/trainer_test_util.h"

namespace mcpp {
namespace {
using mcpp::testing::error_of;
using mcpp::testing::random_tensor;

Tensor counts_of(const std::vector<int64_t>& c) {
  Tensor t = Tensor::empty({static_cast<int64_t>(c.size())}, DType::I64);
  std::copy(c.begin(), c.end(), t.data<int64_t>());
  return t;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double m = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, std::abs(double(a.data<float>()[i]) - double(b.data<float>()[i])));
  return m;
}

TEST(GroupedGemmOps, MatchThePerGroupDefinitions) {
  const std::vector<int64_t> rows = {5, 0, 17, 1, 0, 9};  // uneven, empty groups (also the last)
  const int64_t g = static_cast<int64_t>(rows.size()), in = 12, out = 7;
  int64_t m = 0;
  for (int64_t r : rows) m += r;
  Tensor counts = counts_of(rows), x = random_tensor({m, in}, 1), dy = random_tensor({m, out}, 2);
  std::vector<Tensor> w, b, dw, db, dw0, db0;
  for (int64_t i = 0; i < g; ++i) {
    w.push_back(random_tensor({out, in}, 10 + i));
    b.push_back(random_tensor({out}, 30 + i));
    dw0.push_back(random_tensor({out, in}, 50 + i));  // a previous microbatch's grads
    db0.push_back(random_tensor({out}, 70 + i));
  }
  Tensor y = Tensor::empty({m, out}), dx = Tensor::empty({m, in});
  ops::grouped_linear_fwd(y, x, w, b, counts);
  ops::grouped_linear_dgrad(dx, dy, w, counts);
  for (bool overwrite : {false, true}) {
    SCOPED_TRACE(overwrite ? "overwrite" : "accumulate");
    dw.clear();
    db.clear();
    for (int64_t i = 0; i < g; ++i) {
      dw.push_back(dw0[static_cast<size_t>(i)].clone());
      db.push_back(db0[static_cast<size_t>(i)].clone());
    }
    ops::grouped_linear_wgrad(dw, db, dy, x, counts, overwrite ? ops::GradWrite::Overwrite : ops::GradWrite::Accumulate);
    int64_t r0 = 0;
    for (int64_t e = 0; e < g; ++e) {
      const size_t es = static_cast<size_t>(e);
      const int64_t r1 = r0 + rows[es];
      for (int64_t o = 0; o < out; ++o) {
        for (int64_t i = 0; i < in; ++i) {  // dW[o, i] = (old) + sum_r dy[r, o] x[r, i]
          double s = overwrite ? 0.0 : dw0[es].data<float>()[o * in + i];
          for (int64_t r = r0; r < r1; ++r) s += double(dy.data<float>()[r * out + o]) * x.data<float>()[r * in + i];
          EXPECT_NEAR(dw[es].data<float>()[o * in + i], s, 1e-5) << "dW group " << e;  // fp32 sums of 17 terms
        }
        double s = overwrite ? 0.0 : db0[es].data<float>()[o];
        for (int64_t r = r0; r < r1; ++r) s += dy.data<float>()[r * out + o];
        EXPECT_NEAR(db[es].data<float>()[o], s, 1e-5) << "db group " << e;
      }
      if (overwrite) {  // the row outputs once
        r0 = r1;
        continue;
      }
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t o = 0; o < out; ++o) {  // y[r, o] = b[o] + sum_i x[r, i] W[o, i]
          double s = b[es].data<float>()[o];
          for (int64_t i = 0; i < in; ++i) s += double(x.data<float>()[r * in + i]) * w[es].data<float>()[o * in + i];
          EXPECT_NEAR(y.data<float>()[r * out + o], s, 1e-5) << "y row " << r;  // fp32 sums of 12 terms
        }
        for (int64_t i = 0; i < in; ++i) {  // dx[r, i] = sum_o dy[r, o] W[o, i]
          double s = 0.0;
          for (int64_t o = 0; o < out; ++o) s += double(dy.data<float>()[r * out + o]) * w[es].data<float>()[o * in + i];
          EXPECT_NEAR(dx.data<float>()[r * in + i], s, 1e-5) << "dx row " << r;
        }
      }
      r0 = r1;
    }
  }
}

// The fused GELU ops are linear_gelu_fwd / linear_dgelu_bwd on each group's rows, bit for bit (what SequentialMLP runs).
TEST(GroupedGemmOps, GeluOpsAreThePerGroupFusedOps) {
  const std::vector<int64_t> rows = {5, 0, 17, 1, 0, 9};
  const int64_t g = static_cast<int64_t>(rows.size()), in = 12, out = 7;
  int64_t m = 0;
  for (int64_t r : rows) m += r;
  // fc1 + GELU: x [m, in] -> act, pre [m, out]; fc2's dgrad + gelu': dy [m, out] @ w_g [out, in] -> dpre [m, in]
  Tensor counts = counts_of(rows), x = random_tensor({m, in}, 1), dy = random_tensor({m, out}, 2);
  Tensor pre_in = random_tensor({m, in}, 3);  // the kept GELU input of the dgrad
  std::vector<Tensor> w, b;
  for (int64_t i = 0; i < g; ++i) {
    w.push_back(random_tensor({out, in}, 10 + i));
    b.push_back(random_tensor({out}, 30 + i));
  }
  Tensor dpre = Tensor::empty({m, in});
  ops::grouped_linear_dgelu_bwd(dpre, dy, w, pre_in, counts);
  for (bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "bias" : "no bias");
    Tensor act = Tensor::empty({m, out}), pre = Tensor::empty({m, out});
    ops::grouped_linear_gelu_fwd(act, pre, x, w, with_bias ? b : std::vector<Tensor>{}, counts);
    int64_t r0 = 0;
    for (int64_t e = 0; e < g; ++e) {
      const int64_t r = rows[static_cast<size_t>(e)];
      if (r == 0) continue;
      const Tensor& we = w[static_cast<size_t>(e)];
      Tensor act_e = Tensor::empty({r, out}), pre_e = Tensor::empty({r, out}), dpre_e = Tensor::empty({r, in});
      ops::linear_gelu_fwd(act_e, pre_e, x.narrow0(r0, r), we, with_bias ? &b[static_cast<size_t>(e)] : nullptr);
      ops::linear_dgelu_bwd(dpre_e, nullptr, dy.narrow0(r0, r), we, pre_in.narrow0(r0, r));
      EXPECT_EQ(max_abs_diff(act.narrow0(r0, r), act_e), 0.0) << "group " << e;
      EXPECT_EQ(max_abs_diff(pre.narrow0(r0, r), pre_e), 0.0) << "group " << e;
      EXPECT_EQ(max_abs_diff(dpre.narrow0(r0, r), dpre_e), 0.0) << "group " << e;
      r0 += r;
    }
  }
  Tensor act = Tensor::empty({m, out});  // pre_act of another shape: a named error
  EXPECT_NE(error_of([&] { ops::grouped_linear_gelu_fwd(act, pre_in, x, w, {}, counts); }).find("pre_act"),
            std::string::npos);
}

TEST(GroupedGemmOps, BadSizesAreNamedErrors) {
  Tensor x = random_tensor({6, 4}, 1), y = Tensor::empty({6, 3});
  std::vector<Tensor> w = {random_tensor({3, 4}, 2), random_tensor({3, 4}, 3)};
  EXPECT_NE(error_of([&] { ops::grouped_linear_fwd(y, x, w, {}, counts_of({2, 3})); }).find("sum to 5"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::grouped_linear_fwd(y, x, w, {}, counts_of({6})); }).find("1 groups"),
            std::string::npos);
  std::vector<Tensor> bad = {random_tensor({3, 5}, 2), random_tensor({3, 4}, 3)};
  EXPECT_NE(error_of([&] { ops::grouped_linear_fwd(y, x, bad, {}, counts_of({2, 4})); }).find("weight 0"),
            std::string::npos);
}

struct LayerRun {
  Tensor y, dx, grads;
  int64_t ready = 0;
};

LayerRun run_layer(TransformerConfig c, bool grouped, int64_t microbatches) {
  c.moe_grouped_gemm = grouped;
  ParamAndGradBuffer params;
  params.set_overwrite_main_grad(true);
  moe::MoELayer layer(params, params, "mlp", c, testing::single_tp());
  params.finalize(3);
  params.grad_buffer().fill_(7.0f);  // a previous step's values
  LayerRun r;
  params.set_grad_ready_hook([&](Parameter&) { ++r.ready; });
  params.zero_grad();
  for (int64_t mb = 0; mb < microbatches; ++mb) {  // the second microbatch accumulates
    moe::MoELayerCtx ctx;
    Tensor x = random_tensor({6, 2, c.hidden_size}, 9 + static_cast<uint64_t>(mb));
    r.y = layer.forward(ctx, x, nullptr);
    r.dx = layer.backward(ctx, random_tensor({6, 2, c.hidden_size}, 20 + static_cast<uint64_t>(mb)), 1.0f);
  }
  r.grads = params.grad_buffer().clone();
  return r;
}

void expect_grouped_equals_sequential(const TransformerConfig& c, int64_t microbatches) {
  const LayerRun seq = run_layer(c, false, microbatches), grp = run_layer(c, true, microbatches);
  // bitwise: the CPU grouped ops are the per-expert GEMMs on the same rows, the activations the same ops
  EXPECT_EQ(max_abs_diff(grp.y, seq.y), 0.0);
  EXPECT_EQ(max_abs_diff(grp.dx, seq.dx), 0.0);
  EXPECT_EQ(max_abs_diff(grp.grads, seq.grads), 0.0);
  EXPECT_EQ(grp.ready, seq.ready);
  EXPECT_GT(ops::sum_of_squares(grp.grads), 0.0);
}

TEST(GroupedMLP, MatchesSequentialMLPGeluWithBiases) {
  TransformerConfig c = testing::tiny_config("gpt2");
  ASSERT_TRUE(c.add_bias_linear);
  c.num_moe_experts = 4;
  c.moe_router_topk = 2;
  c.finalize();
  c.validate();
  expect_grouped_equals_sequential(c, 2);
}

TEST(GroupedMLP, MatchesSequentialMLPSwiGluAndIdleExperts) {
  TransformerConfig c = testing::tiny_config("llama");
  ASSERT_TRUE(c.swiglu);
  c.num_moe_experts = 64;  // 12 tokens x top-1 cannot reach them all: experts without rows
  c.moe_router_topk = 1;
  c.finalize();
  c.validate();
  expect_grouped_equals_sequential(c, 1);
  // the idle experts' grads are zero (overwritten: the step's first write), every parameter reported once
  TransformerConfig g = c;
  g.moe_grouped_gemm = true;
  ParamAndGradBuffer params;
  params.set_overwrite_main_grad(true);
  moe::MoELayer layer(params, params, "mlp", g, testing::single_tp());
  params.finalize(3);
  params.grad_buffer().fill_(7.0f);
  int64_t ready = 0;
  params.set_grad_ready_hook([&](Parameter&) { ++ready; });
  params.zero_grad();
  moe::MoELayerCtx ctx;
  layer.forward(ctx, random_tensor({6, 2, c.hidden_size}, 9), nullptr);
  const std::vector<int64_t> tokens = ctx.router.tokens_per_expert;
  ASSERT_EQ(tokens.size(), 0u);  // dropless at EP 1: the counts stay on the device (no host read)
  const Tensor counts = ctx.router.counts.clone();
  layer.backward(ctx, random_tensor({6, 2, c.hidden_size}, 10), 1.0f);
  EXPECT_EQ(ready, static_cast<int64_t>(params.params().size()));
  int64_t idle = 0;
  for (int64_t e = 0; e < 64; ++e) {
    if (counts.data<int64_t>()[e] > 0) continue;
    ++idle;
    for (const char* name : {".linear_fc1.weight", ".linear_fc2.weight"}) {
      Parameter* w = params.find("mlp.experts.local_experts." + std::to_string(e) + name);
      ASSERT_NE(w, nullptr);
      EXPECT_FALSE(w->grad_stale);
      EXPECT_EQ(ops::sum_of_squares(w->main_grad), 0.0);
    }
  }
  EXPECT_GT(idle, 0);
}

TEST(GroupedMLP, MatchesSequentialMLPWithActivationRecompute) {
  TransformerConfig c = testing::tiny_config("gpt2");
  c.num_moe_experts = 4;
  c.moe_router_topk = 2;
  c.recompute_granularity = "selective";
  c.recompute_modules = {"moe_act"};
  c.finalize();
  c.validate();
  expect_grouped_equals_sequential(c, 1);
}

TEST(GroupedMLP, MatchesSequentialMLPPaddedToCapacity) {  // host counts (the capacity), copied to the device once
  TransformerConfig c = testing::tiny_config("llama");
  c.num_moe_experts = 4;
  c.moe_router_topk = 2;
  c.moe_expert_capacity_factor = 0.75;
  c.moe_pad_expert_input_to_capacity = true;
  c.finalize();
  c.validate();
  expect_grouped_equals_sequential(c, 2);
}

TEST(GroupedMLP, FlagParsesAndLetsDroplessMoeRunUnderCudaGraphs) {
  Config parsed = parse_train_args({"--moe-grouped-gemm"});
  EXPECT_TRUE(parsed.model.moe_grouped_gemm);
  EXPECT_FALSE(parse_train_args({}).model.moe_grouped_gemm);
  Config c = training_test::tiny_train_config("unused_prefix");
  c.model.hidden_dropout = 0.0f;
  c.model.attention_dropout = 0.0f;
  c.model.num_moe_experts = 4;
  c.model.moe_ffn_hidden_size = c.model.ffn_hidden_size;
  c.training.enable_cuda_graph = true;
  c.training.device = "auto";
  const std::string dropless = training_test::error_of([&] { c.validate(); });
  EXPECT_NE(dropless.find("--moe-grouped-gemm"), std::string::npos) << dropless;
  c.model.moe_grouped_gemm = true;  // the experts read the router's counts on the device
  EXPECT_EQ(training_test::error_of([&] { c.validate(); }), "");
  Config capped = c;  // dropping without padding: the buffer's rows are read on the host again
  capped.model.moe_expert_capacity_factor = 1.0;
  EXPECT_NE(training_test::error_of([&] { capped.validate(); }).find("--moe-pad-expert-input-to-capacity"),
            std::string::npos);
  Config many = c;  // more local experts than one grouped launch takes
  many.training.enable_cuda_graph = false;
  many.model.num_moe_experts = 2 * ops::kMaxGemmGroups;
  EXPECT_NE(training_test::error_of([&] { many.validate(); }).find("moe_grouped_gemm"), std::string::npos);
}

}  // namespace
}  // namespace mcpp
