// ops::cpu::linear_gelu_fwd / linear_dgelu_bwd (the GELU MLP's fused ops): bitwise the unfused ops they
// replace (linear_fwd + gelu_fwd; linear_bwd's dgrad + gelu_bwd + linear_bwd's bias column sum), and within
// float rounding of a float64 reference (tanh GELU and its derivative). The CPU backend is float32 only:
// bfloat16 arguments are rejected with an error naming the op and the argument (the CUDA tests in
// tests/cuda/linear_gelu_test.cpp cover bf16 against these CPU ops).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "kernels/grad_check.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {
namespace {
using namespace mcpp::testing;
namespace cpu = mcpp::ops::cpu;

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

double gelu_ref(double v) { return 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))); }
double gelu_grad_ref(double v) {
  const double k = 0.7978845608028654, t = std::tanh(k * (v + 0.044715 * v * v * v));
  return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * v * v);
}

TEST(CpuLinearGelu, ForwardIsLinearThenGeluBitwiseAndMatchesFloat64) {
  const int64_t s = 5, b = 3, in = 40, out = 72;
  std::vector<double> x, w, bias;
  Tensor tx = random_tensor({s, b, in}, 1, &x, -2.0, 2.0), tw = random_tensor({out, in}, 2, &w);
  Tensor tb = random_tensor({out}, 3, &bias);
  for (const Tensor* bp : {static_cast<const Tensor*>(&tb), static_cast<const Tensor*>(nullptr)}) {
    SCOPED_TRACE(bp ? "bias" : "no bias");
    Tensor act = Tensor::empty({s, b, out}), pre = Tensor::empty({s, b, out});
    cpu::linear_gelu_fwd(act, pre, tx, tw, bp, {});
    Tensor pre_ref = Tensor::empty({s, b, out}), act_ref = Tensor::empty({s, b, out});
    cpu::linear_fwd(pre_ref, tx, tw, bp, {});
    cpu::gelu_fwd(act_ref, pre_ref, {});
    EXPECT_TRUE(bitwise_equal(pre, pre_ref));
    EXPECT_TRUE(bitwise_equal(act, act_ref));
    std::vector<double> want_pre(static_cast<size_t>(s * b * out)), want_act(want_pre.size());
    for (int64_t r = 0; r < s * b; ++r)
      for (int64_t o = 0; o < out; ++o) {
        double acc = bp ? bias[o] : 0.0;
        for (int64_t i = 0; i < in; ++i) acc += x[r * in + i] * w[o * in + i];
        want_pre[r * out + o] = acc;
        want_act[r * out + o] = gelu_ref(acc);
      }
    // fp32 length-40 dots of O(1) terms round to ~40 * 2^-24 absolute (cancellation can leave a small
    // result), so the floor is the data scale, 1.0; the CPU GELU adds its documented 5.8e-7 relative.
    EXPECT_LT(max_rel_error(pre, want_pre, 1.0), 1e-5);
    EXPECT_LT(max_rel_error(act, want_act, 1.0), 1e-5);
  }
}

TEST(CpuLinearGelu, BackwardIsDgradGeluBwdBiasSumBitwiseAndAccumulates) {
  // w = fc2's W[out=h, in=f]; dy [n, h]; pre_act [n, f]; db_acc [f] (fc1's bias grad) has prior contents.
  const int64_t n = 37, h = 24, f = 64;
  std::vector<double> dy, w, pre, db0;
  Tensor tdy = random_tensor({n, h}, 10, &dy), tw = random_tensor({h, f}, 11, &w);
  Tensor tpre = random_tensor({n, f}, 12, &pre, -3.0, 3.0), db = random_tensor({f}, 13, &db0);
  Tensor db_ref = db.clone();
  Tensor dpre = Tensor::empty({n, f});
  cpu::linear_dgelu_bwd(dpre, &db, tdy, tw, tpre, {});

  // Today's unfused path: fc2's linear_bwd dgrad, gelu_bwd, fc1's linear_bwd bias column sum.
  Tensor dact = Tensor::empty({n, f}), dw2 = Tensor::zeros({h, f}), fc1_x = random_tensor({n, 8}, 14);
  cpu::linear_bwd(&dact, dw2, nullptr, tdy, random_tensor({n, f}, 16), tw, ops::GradWrite::Accumulate, {});
  Tensor dpre_ref = Tensor::empty({n, f});
  cpu::gelu_bwd(dpre_ref, dact, tpre, {});
  Tensor dw1 = Tensor::zeros({f, 8}), w1 = random_tensor({f, 8}, 15);
  cpu::linear_bwd(nullptr, dw1, &db_ref, dpre_ref, fc1_x, w1, ops::GradWrite::Accumulate, {});
  EXPECT_TRUE(bitwise_equal(dpre, dpre_ref));
  EXPECT_TRUE(bitwise_equal(db, db_ref));

  std::vector<double> want(static_cast<size_t>(n * f)), want_db = db0;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < f; ++c) {
      double acc = 0.0;
      for (int64_t o = 0; o < h; ++o) acc += dy[r * h + o] * w[o * f + c];
      want[r * f + c] = acc * gelu_grad_ref(pre[r * f + c]);
      want_db[c] += want[r * f + c];
    }
  // The CPU gelu_bwd is documented within 6e-6 of float64 (relative, 1e-3 floor); the length-24 fp32 dots
  // round to ~24 * 2^-24 absolute, and cancellation can leave a small dot (measured 1.6e-5 with a 1e-2 floor
  // on the device machine's CPU), so the floor is the data scale, 1.0.
  EXPECT_LT(max_rel_error(dpre, want, 1.0), 1e-5);
  EXPECT_LT(max_rel_error(db, want_db, 1.0), 1e-5);  // sums of 37 such values onto O(1) priors

  Tensor dpre2 = Tensor::empty({n, f});
  cpu::linear_dgelu_bwd(dpre2, nullptr, tdy, tw, tpre, {});  // no bias grad: dpre alone, unchanged
  EXPECT_TRUE(bitwise_equal(dpre2, dpre_ref));
}

void expect_error_naming(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected mcpp::Error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(CpuLinearGelu, BadArgumentsNameTheOpAndArgument) {
  Tensor x = Tensor::zeros({4, 8}), w = Tensor::zeros({16, 8}), act = Tensor::zeros({4, 16});
  Tensor pre_short = Tensor::zeros({4, 15}), bias_short = Tensor::zeros({15});
  expect_error_naming([&] { cpu::linear_gelu_fwd(act, pre_short, x, w, nullptr, {}); },
                      "linear_gelu_fwd: pre_act must have the shape of act");
  Tensor pre = Tensor::zeros({4, 16});
  expect_error_naming([&] { cpu::linear_gelu_fwd(act, pre, x, w, &bias_short, {}); }, "linear_gelu_fwd: bias must have 16");
  Tensor xb = x.to(DType::BF16);
  expect_error_naming([&] { cpu::linear_gelu_fwd(act, pre, xb, w, nullptr, {}); }, "linear_gelu_fwd: x must be float32");

  // backward: w [h=8, f=16], dy [4, 8], pre_act / dpre [4, 16], db_acc [16]
  Tensor w2 = Tensor::zeros({8, 16}), dy = Tensor::zeros({4, 8}), dpre = Tensor::zeros({4, 16});
  Tensor pre_wrong = Tensor::zeros({4, 12});
  expect_error_naming([&] { cpu::linear_dgelu_bwd(dpre, nullptr, dy, w2, pre_wrong, {}); },
                      "linear_dgelu_bwd: pre_act must be [.., in=16]");
  Tensor dpre_wrong = Tensor::zeros({5, 16});
  expect_error_naming([&] { cpu::linear_dgelu_bwd(dpre_wrong, nullptr, dy, w2, pre, {}); },
                      "linear_dgelu_bwd: dpre must have the shape of pre_act");
  Tensor db_short = Tensor::zeros({15});
  expect_error_naming([&] { cpu::linear_dgelu_bwd(dpre, &db_short, dy, w2, pre, {}); },
                      "linear_dgelu_bwd: db_acc must have 16 elements");
  Tensor dyb = dy.to(DType::BF16);
  expect_error_naming([&] { cpu::linear_dgelu_bwd(dpre, nullptr, dyb, w2, pre, {}); },
                      "linear_dgelu_bwd: dy must be float32");
}

}  // namespace
}  // namespace mcpp
