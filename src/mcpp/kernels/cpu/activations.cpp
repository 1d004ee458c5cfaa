// CPU activations, fp32, elementwise (math in float64 per element for a clean reference).
//
//   gelu_fwd:   y = 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2/pi)  (tanh approximation, as
//               Megatron's openai_gelu / bias_gelu); x, y any shape, same numel.
//   gelu_bwd:   dx = dy * (0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 * 0.044715 x^2)), t = tanh(...)
//   swiglu_fwd: x[n, 2f] = [gate | up] along the last dim; y[n, f] = silu(gate) * up
//   swiglu_bwd: dgate = dy * up * s (1 + gate (1 - s)), s = sigmoid(gate); dup = dy * silu(gate);
//               dx[n, 2f] = [dgate | dup]
// All outputs overwritten; dx may alias dy for GELU (each element reads its dy before writing dx).
#include <cmath>
#include <utility>

#include "mcpp/kernels/cpu/checks.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cpu {
using detail::require_cpu_f32;

namespace {
constexpr double kGeluK = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kGeluC = 0.044715;
constexpr int64_t kParallelMin = 1 << 15;

// Checks x [.., 2f] and y [.., f] (same leading dims); returns {rows n, f}.
std::pair<int64_t, int64_t> swiglu_dims(const char* op, const Tensor& x, const Tensor& y, const char* y_name) {
  require_cpu_f32(op, "x", x);
  require_cpu_f32(op, y_name, y);
  const int64_t two_f = detail::last_dim(op, "x", x);
  MCPP_CHECK(two_f % 2 == 0, "{}: x last dim must be 2*f ([gate | up]); got {}", op, x.str());
  Shape want = x.shape();
  want.back() = two_f / 2;
  MCPP_CHECK(y.shape() == want, "{}: {} must be {} for x {}; got {}", op, y_name, shape_str(want), x.str(), y.str());
  const int64_t f = two_f / 2;
  return {f ? y.numel() / f : 0, f};
}
}  // namespace

void gelu_fwd(Tensor& y, const Tensor& x, Stream) {
  require_cpu_f32("gelu_fwd", "y", y);
  require_cpu_f32("gelu_fwd", "x", x);
  detail::require_numel("gelu_fwd", "x", x, y.numel(), "numel of y");
  const float* px = x.data<float>();
  float* py = y.data<float>();
  const int64_t n = y.numel();
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const double v = px[i];
    py[i] = static_cast<float>(0.5 * v * (1.0 + std::tanh(kGeluK * (v + kGeluC * v * v * v))));
  }
}

void gelu_bwd(Tensor& dx, const Tensor& dy, const Tensor& x, Stream) {
  require_cpu_f32("gelu_bwd", "dx", dx);
  require_cpu_f32("gelu_bwd", "dy", dy);
  require_cpu_f32("gelu_bwd", "x", x);
  detail::require_numel("gelu_bwd", "dy", dy, dx.numel(), "numel of dx");
  detail::require_numel("gelu_bwd", "x", x, dx.numel(), "numel of dx");
  const float* px = x.data<float>();
  const float* pdy = dy.data<float>();
  float* pdx = dx.data<float>();
  const int64_t n = dx.numel();
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const double v = px[i];
    const double t = std::tanh(kGeluK * (v + kGeluC * v * v * v));
    const double d = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * kGeluK * (1.0 + 3.0 * kGeluC * v * v);
    pdx[i] = static_cast<float>(pdy[i] * d);
  }
}

void swiglu_fwd(Tensor& y, const Tensor& x, Stream) {
  const auto [n, f] = swiglu_dims("swiglu_fwd", x, y, "y");
  const float* px = x.data<float>();
  float* py = y.data<float>();
#pragma omp parallel for schedule(static) if (n * f > kParallelMin)
  for (int64_t r = 0; r < n; ++r) {
    const float* gate = px + r * 2 * f;  // [f]
    const float* up = gate + f;          // [f]
    float* yr = py + r * f;
    for (int64_t c = 0; c < f; ++c) {
      const double g = gate[c];
      yr[c] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[c]);
    }
  }
}

void swiglu_bwd(Tensor& dx, const Tensor& dy, const Tensor& x, Stream) {
  const auto [n, f] = swiglu_dims("swiglu_bwd", x, dy, "dy");
  require_cpu_f32("swiglu_bwd", "dx", dx);
  detail::require_same_shape("swiglu_bwd", "dx", dx, "x", x);
  const float* px = x.data<float>();
  const float* pdy = dy.data<float>();
  float* pdx = dx.data<float>();
#pragma omp parallel for schedule(static) if (n * f > kParallelMin)
  for (int64_t r = 0; r < n; ++r) {
    const float* gate = px + r * 2 * f;
    const float* up = gate + f;
    const float* dyr = pdy + r * f;
    float* dgate = pdx + r * 2 * f;
    float* dup = dgate + f;
    for (int64_t c = 0; c < f; ++c) {
      const double g = gate[c], u = up[c], d = dyr[c];
      const double s = 1.0 / (1.0 + std::exp(-g));
      dgate[c] = static_cast<float>(d * u * s * (1.0 + g * (1.0 - s)));
      dup[c] = static_cast<float>(d * g * s);
    }
  }
}

}  // namespace mcpp::ops::cpu
