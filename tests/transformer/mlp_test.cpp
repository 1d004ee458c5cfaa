// MLP with GELU on CPU (one rank): the fused path (fc1 forward_gelu, fc2 backward_dgelu, fc1 backward
// with its bias grad) is bitwise the unfused composition it replaced — linear_fwd, gelu_fwd,
// linear_fwd; linear_bwd (fc2), gelu_bwd, linear_bwd (fc1, with its bias column sum) — for the output, the
// input grad and every parameter's main grad, over two microbatches that accumulate. SwiGLU keeps its path
// (checked the same way). Under FP8 delayed scaling the activation (GELU or SwiGLU) rides in the FP8 casts (checked
// against the unfused FP8 composition).
#include <gtest/gtest.h>

#include <cstring>

#include "kernels/grad_check.h"
#include "mcpp/distributed/param_and_grad_buffer.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/transformer/mlp.h"
#include "models/gpt_test_util.h"

namespace mcpp {
namespace {
using mcpp::testing::random_tensor;

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

struct Weights {
  Parameter *w1, *b1, *w2, *b2;
};

// A fresh delayed FP8 state's operand: scale 1.
ops::Fp8Operand unit(ops::Fp8Format fmt = ops::Fp8Format::E4M3) {
  Tensor sc = Tensor::empty({2});
  sc.fill_(1.0f);
  return ops::Fp8Operand{.scale = sc, .format = fmt};
}

TEST(MlpGelu, FusedPathIsBitwiseTheUnfusedOps) {
  TransformerConfig c = testing::tiny_config("gpt2");  // h 32, f 128, biases, GELU
  c.validate();
  ParamAndGradBuffer params;
  MLP mlp(params, "mlp", c, testing::single_tp(), tensor_parallel::Fp8Options{});  // no FP8
  params.finalize(7);
  Weights p{params.find("mlp.linear_fc1.weight"), params.find("mlp.linear_fc1.bias"),
            params.find("mlp.linear_fc2.weight"), params.find("mlp.linear_fc2.bias")};
  ASSERT_TRUE(p.w1 && p.b1 && p.w2 && p.b2);
  p.b1->data.copy_from(random_tensor({c.ffn_hidden_size}, 1));  // biases start at zero: make them count
  p.b2->data.copy_from(random_tensor({c.hidden_size}, 2));

  const int64_t s = 6, b = 2, h = c.hidden_size, f = c.ffn_hidden_size, n = s * b;
  std::vector<Tensor> xs{random_tensor({s, b, h}, 3, nullptr, -2.0, 2.0), random_tensor({s, b, h}, 4, nullptr, -2.0, 2.0)};
  std::vector<Tensor> dys{random_tensor({s, b, h}, 5), random_tensor({s, b, h}, 6)};
  std::vector<MLPCtx> ctx(2);
  std::vector<Tensor> ys, dxs;
  for (size_t m = 0; m < 2; ++m) ys.push_back(mlp.forward(ctx[m], xs[m]));
  for (size_t m = 0; m < 2; ++m) dxs.push_back(mlp.backward(ctx[m], dys[m]));

  Tensor dw1 = Tensor::zeros({f, h}), db1 = Tensor::zeros({f}), dw2 = Tensor::zeros({h, f}), db2 = Tensor::zeros({h});
  for (size_t m = 0; m < 2; ++m) {
    SCOPED_TRACE(m);
    Tensor x2 = xs[m].view({n, h}), dy2 = dys[m].view({n, h});
    Tensor pre = Tensor::empty({n, f}), act = Tensor::empty({n, f}), y = Tensor::empty({n, h});
    ops::linear_fwd(pre, x2, p.w1->data, &p.b1->data);
    ops::gelu_fwd(act, pre);
    ops::linear_fwd(y, act, p.w2->data, &p.b2->data);  // tp == 1: RowParallelLinear's bias rides in the GEMM
    EXPECT_TRUE(bitwise_equal(ys[m], y));
    Tensor dact = Tensor::empty({n, f}), dpre = Tensor::empty({n, f}), dx = Tensor::empty({n, h});
    ops::linear_bwd(&dact, dw2, &db2, dy2, act, p.w2->data, ops::GradWrite::Accumulate);
    ops::gelu_bwd(dpre, dact, pre);
    ops::linear_bwd(&dx, dw1, &db1, dpre, x2, p.w1->data, ops::GradWrite::Accumulate);
    EXPECT_TRUE(bitwise_equal(dxs[m], dx));
    EXPECT_TRUE(bitwise_equal(ctx[m].pre_act, pre));
  }
  EXPECT_TRUE(bitwise_equal(p.w1->main_grad, dw1));
  EXPECT_TRUE(bitwise_equal(p.b1->main_grad, db1));  // added once (in fc1's backward)
  EXPECT_TRUE(bitwise_equal(p.w2->main_grad, dw2));
  EXPECT_TRUE(bitwise_equal(p.b2->main_grad, db2));
}

// FP8 delayed scaling (fp8_act_in_casts()): fc1 writes the pre-activation, GELU rides in fc2's input cast and gelu' in
// fc1's gradient cast — bitwise the unfused FP8 composition (FP8 linear, gelu_fwd, FP8 linear; FP8 backward, gelu_bwd,
// FP8 backward with fc1's bias sums of the gelu'd gradient), with the fresh states' scales (1). Tensorwise takes the
// amax first, so it keeps the unfused path.
TEST(MlpGelu, Fp8DelayedAppliesTheActivationInTheCasts) {
  TransformerConfig c = testing::tiny_config("gpt2");
  c.fp8_format = "hybrid";
  c.fp8_recipe = "tensorwise";
  c.validate();
  {
    ParamAndGradBuffer tw;
    EXPECT_FALSE(MLP(tw, "mlp", c, testing::single_tp(), c.fp8_options()).fp8_act_in_casts());
  }
  c.fp8_recipe = "delayed";
  c.validate();
  ParamAndGradBuffer params;
  MLP mlp(params, "mlp", c, testing::single_tp(), c.fp8_options());
  ASSERT_TRUE(mlp.fp8_act_in_casts());
  params.finalize(13);
  Weights p{params.find("mlp.linear_fc1.weight"), params.find("mlp.linear_fc1.bias"),
            params.find("mlp.linear_fc2.weight"), params.find("mlp.linear_fc2.bias")};
  p.b1->data.copy_from(random_tensor({c.ffn_hidden_size}, 1));
  p.b2->data.copy_from(random_tensor({c.hidden_size}, 2));
  const int64_t s = 6, b = 2, h = c.hidden_size, f = c.ffn_hidden_size, n = s * b;
  const Tensor x = random_tensor({s, b, h}, 3, nullptr, -2.0, 2.0), dy = random_tensor({s, b, h}, 5);
  MLPCtx ctx;
  const Tensor y_mlp = mlp.forward(ctx, x);
  const Tensor dx_mlp = mlp.backward(ctx, dy);

  const ops::Fp8Operand fx = unit(), fw = unit(), fdy = unit(ops::Fp8Format::E5M2);
  Tensor x2 = x.view({n, h}), dy2 = dy.view({n, h});
  Tensor pre = Tensor::empty({n, f}), act = Tensor::empty({n, f}), y = Tensor::empty({n, h});
  ops::fp8_linear_fwd(pre, x2, p.w1->data, &p.b1->data, fx, fw, nullptr);
  ops::gelu_fwd(act, pre);
  ops::fp8_linear_fwd(y, act, p.w2->data, &p.b2->data, fx, fw, nullptr);
  EXPECT_TRUE(bitwise_equal(y_mlp, y));
  EXPECT_TRUE(bitwise_equal(ctx.pre_act, pre));
  Tensor dw1 = Tensor::zeros({f, h}), db1 = Tensor::zeros({f}), dw2 = Tensor::zeros({h, f}), db2 = Tensor::zeros({h});
  Tensor dact = Tensor::empty({n, f}), dpre = Tensor::empty({n, f}), dx = Tensor::empty({n, h});
  ops::fp8_linear_bwd(&dact, dw2, &db2, dy2, act, p.w2->data, fdy, fx, fw, nullptr, ops::GradWrite::Accumulate);
  ops::gelu_bwd(dpre, dact, pre);
  ops::fp8_linear_bwd(&dx, dw1, &db1, dpre, x2, p.w1->data, fdy, fx, fw, nullptr, ops::GradWrite::Accumulate);
  EXPECT_TRUE(bitwise_equal(dx_mlp, dx));
  EXPECT_TRUE(bitwise_equal(p.w1->main_grad, dw1));
  EXPECT_TRUE(bitwise_equal(p.b1->main_grad, db1));
  EXPECT_TRUE(bitwise_equal(p.w2->main_grad, dw2));
  EXPECT_TRUE(bitwise_equal(p.b2->main_grad, db2));
}

// The same for SwiGLU (Llama: no biases): swiglu in fc2's input cast (fc2 reads the [n, 2f] pre-activation) and
// swiglu_bwd in fc1's gradient cast (from fc2's [n, f] dgrad and the pre-activation) — bitwise the unfused FP8
// composition (FP8 linear, swiglu_fwd, FP8 linear; FP8 backward, swiglu_bwd, FP8 backward).
TEST(MlpSwiglu, Fp8DelayedAppliesTheActivationInTheCasts) {
  TransformerConfig c = testing::tiny_config("llama");
  c.fp8_format = "hybrid";
  c.fp8_recipe = "delayed";
  c.validate();
  ParamAndGradBuffer params;
  MLP mlp(params, "mlp", c, testing::single_tp(), c.fp8_options());
  ASSERT_TRUE(mlp.fp8_act_in_casts());
  params.finalize(17);
  Parameter* w1 = params.find("mlp.linear_fc1.weight");
  Parameter* w2 = params.find("mlp.linear_fc2.weight");
  const int64_t s = 6, b = 2, h = c.hidden_size, f = c.ffn_hidden_size, n = s * b;
  const Tensor x = random_tensor({s, b, h}, 23, nullptr, -2.0, 2.0), dy = random_tensor({s, b, h}, 25);
  MLPCtx ctx;
  const Tensor y_mlp = mlp.forward(ctx, x);
  const Tensor dx_mlp = mlp.backward(ctx, dy);

  const ops::Fp8Operand fx = unit(), fw = unit(), fdy = unit(ops::Fp8Format::E5M2);
  Tensor pre = Tensor::empty({n, 2 * f}), act = Tensor::empty({n, f}), y = Tensor::empty({n, h});
  ops::fp8_linear_fwd(pre, x.view({n, h}), w1->data, nullptr, fx, fw, nullptr);
  ops::swiglu_fwd(act, pre);
  ops::fp8_linear_fwd(y, act, w2->data, nullptr, fx, fw, nullptr);
  EXPECT_TRUE(bitwise_equal(y_mlp, y));
  EXPECT_TRUE(bitwise_equal(ctx.pre_act, pre));
  Tensor dw1 = Tensor::zeros({2 * f, h}), dw2 = Tensor::zeros({h, f});
  Tensor dact = Tensor::empty({n, f}), dpre = Tensor::empty({n, 2 * f}), dx = Tensor::empty({n, h});
  ops::fp8_linear_bwd(&dact, dw2, nullptr, dy.view({n, h}), act, w2->data, fdy, fx, fw, nullptr,
                      ops::GradWrite::Accumulate);
  ops::swiglu_bwd(dpre, dact, pre);
  ops::fp8_linear_bwd(&dx, dw1, nullptr, dpre, x.view({n, h}), w1->data, fdy, fx, fw, nullptr,
                      ops::GradWrite::Accumulate);
  EXPECT_TRUE(bitwise_equal(dx_mlp, dx));
  EXPECT_TRUE(bitwise_equal(w1->main_grad, dw1));
  EXPECT_TRUE(bitwise_equal(w2->main_grad, dw2));
}

TEST(MlpSwiglu, KeepsTheUnfusedPath) {
  TransformerConfig c = testing::tiny_config("llama");  // SwiGLU, no biases
  c.validate();
  ParamAndGradBuffer params;
  MLP mlp(params, "mlp", c, testing::single_tp(), tensor_parallel::Fp8Options{});  // no FP8
  params.finalize(9);
  Parameter* w1 = params.find("mlp.linear_fc1.weight");
  Parameter* w2 = params.find("mlp.linear_fc2.weight");
  const int64_t s = 4, b = 2, h = c.hidden_size, f = c.ffn_hidden_size, n = s * b;
  Tensor x = random_tensor({s, b, h}, 11), dy = random_tensor({s, b, h}, 12);
  MLPCtx ctx;
  Tensor y = mlp.forward(ctx, x);
  Tensor dx = mlp.backward(ctx, dy);
  Tensor h1 = Tensor::empty({n, 2 * f}), act = Tensor::empty({n, f}), y_ref = Tensor::empty({n, h});
  ops::linear_fwd(h1, x.view({n, h}), w1->data, nullptr);
  ops::swiglu_fwd(act, h1);
  ops::linear_fwd(y_ref, act, w2->data, nullptr);
  EXPECT_TRUE(bitwise_equal(y, y_ref));
  Tensor dw1 = Tensor::zeros({2 * f, h}), dw2 = Tensor::zeros({h, f});
  Tensor dact = Tensor::empty({n, f}), dh1 = Tensor::empty({n, 2 * f}), dx_ref = Tensor::empty({n, h});
  ops::linear_bwd(&dact, dw2, nullptr, dy.view({n, h}), act, w2->data, ops::GradWrite::Accumulate);
  ops::swiglu_bwd(dh1, dact, h1);
  ops::linear_bwd(&dx_ref, dw1, nullptr, dh1, x.view({n, h}), w1->data, ops::GradWrite::Accumulate);
  EXPECT_TRUE(bitwise_equal(dx, dx_ref));
  EXPECT_TRUE(bitwise_equal(w1->main_grad, dw1));
  EXPECT_TRUE(bitwise_equal(w2->main_grad, dw2));
}

}  // namespace
}  // namespace mcpp
