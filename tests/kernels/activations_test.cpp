// ops::cpu::gelu_* / swiglu_* against float64 references and central finite differences of
// L = sum(dy * f(x)).
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/grad_check.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {
namespace {
using namespace mcpp::testing;
namespace cpu = mcpp::ops::cpu;

std::vector<double> ref_gelu(const std::vector<double>& x) {
  std::vector<double> y(x.size());
  const double k = std::sqrt(2.0 / M_PI);
  for (size_t i = 0; i < x.size(); ++i) y[i] = 0.5 * x[i] * (1.0 + std::tanh(k * (x[i] + 0.044715 * std::pow(x[i], 3))));
  return y;
}

// x[n, 2f] = [gate | up] -> y[n, f] = silu(gate) * up
std::vector<double> ref_swiglu(const std::vector<double>& x, int64_t n, int64_t f) {
  std::vector<double> y(static_cast<size_t>(n * f));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < f; ++c) {
      const double g = x[r * 2 * f + c], u = x[r * 2 * f + f + c];
      y[r * f + c] = g / (1.0 + std::exp(-g)) * u;
    }
  return y;
}

TEST(CpuActivations, GeluMatchesFloat64AndFiniteDifferences) {
  for (int64_t n : {37, 70000}) {  // 70000 takes the OpenMP path
    std::vector<double> x, dy;
    Tensor tx = random_tensor({n}, 1, &x, -4.0, 4.0), tdy = random_tensor({n}, 2, &dy);
    Tensor y = Tensor::empty({n}), dx = Tensor::empty({n});
    cpu::gelu_fwd(y, tx, {});
    cpu::gelu_bwd(dx, tdy, tx, {});
    // Double math per element, one fp32 rounding: 1e-6 against a 1e-3 floor (gelu(x) -> 0 for x << 0).
    EXPECT_LT(max_rel_error(y, ref_gelu(x), 1e-3), 1e-6) << "n=" << n;
    // The loss is separable, so the finite-difference gradient is elementwise: f'(x) * dy (checked on a
    // 37-element vector directly, and by the same per-element difference quotient on the large one).
    std::vector<double> want(x.size());
    if (n < 100) {
      want = numeric_grad([&](const std::vector<double>& v) { return dot(dy, ref_gelu(v)); }, x);
    } else {
      for (size_t i = 0; i < x.size(); ++i) {
        const double h = 1e-5;
        want[i] = dy[i] * (ref_gelu({x[i] + h})[0] - ref_gelu({x[i] - h})[0]) / (2 * h);
      }
    }
    // Kernel: closed-form derivative in double, one fp32 rounding; FD error ~1e-10. 1e-5 with 1e-3 floor.
    EXPECT_LT(max_rel_error(dx, want, 1e-3), 1e-5) << "n=" << n;
  }
}

TEST(CpuActivations, GeluBackwardMayAliasDy) {
  std::vector<double> x, dy;
  Tensor tx = random_tensor({50}, 3, &x), tdy = random_tensor({50}, 4, &dy);
  Tensor sep = Tensor::empty({50});
  cpu::gelu_bwd(sep, tdy, tx, {});
  cpu::gelu_bwd(tdy, tdy, tx, {});
  EXPECT_EQ(to_doubles(tdy), to_doubles(sep));  // identical arithmetic, in place
}

TEST(CpuActivations, SwigluMatchesFloat64AndFiniteDifferences) {
  const int64_t s = 3, b = 2, f = 11, n = s * b;
  std::vector<double> x, dy;
  Tensor tx = random_tensor({s, b, 2 * f}, 5, &x, -3.0, 3.0), tdy = random_tensor({s, b, f}, 6, &dy);
  Tensor y = Tensor::empty({s, b, f}), dx = Tensor::empty({s, b, 2 * f});
  cpu::swiglu_fwd(y, tx, {});
  EXPECT_LT(max_rel_error(y, ref_swiglu(x, n, f), 1e-3), 1e-6);  // double math, one fp32 rounding
  dx.fill_(9.0f);  // overwritten
  cpu::swiglu_bwd(dx, tdy, tx, {});
  auto want = numeric_grad([&](const std::vector<double>& v) { return dot(dy, ref_swiglu(v, n, f)); }, x);
  EXPECT_LT(max_rel_error(dx, want, 1e-3), 1e-5);  // closed form in double vs FD (~1e-10)
}

TEST(CpuActivations, SwigluRejectsMismatchedShapes) {
  Tensor x = Tensor::zeros({4, 10}), y_bad = Tensor::zeros({4, 10}), odd = Tensor::zeros({4, 9});
  try {
    cpu::swiglu_fwd(y_bad, x, {});
    FAIL() << "expected mcpp::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("swiglu_fwd: y must be (4, 5)"), std::string::npos) << e.what();
  }
  Tensor y = Tensor::zeros({4, 4});
  EXPECT_THROW(cpu::swiglu_fwd(y, odd, {}), Error);
  Tensor g = Tensor::zeros({3});
  EXPECT_THROW(cpu::gelu_fwd(g, x, {}), Error);
}

}  // namespace
}  // namespace mcpp
