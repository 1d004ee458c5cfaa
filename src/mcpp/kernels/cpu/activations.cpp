// CPU activations, fp32, elementwise (math in float64 per element; GELU takes its exp in float, see below).
//
//   gelu_fwd:   y = 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2/pi)  (tanh approximation, as
//               Megatron's openai_gelu / bias_gelu); x, y any shape, same numel.
//   gelu_bwd:   dx = dy * (0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 * 0.044715 x^2)), t = tanh(...)
//   swiglu_fwd: x[n, 2f] = [gate | up] along the last dim; y[n, f] = silu(gate) * up
//   swiglu_bwd: dgate = dy * up * s (1 + gate (1 - s)), s = sigmoid(gate); dup = dy * silu(gate);
//               dx[n, 2f] = [dgate | dup]
// All outputs overwritten; dx may alias dy for GELU (each element reads its dy before writing dx).
// GELU speed (it was ~8% of the demo step through libm tanh): with u = k (x + 0.044715 x^3) in float64 and
// e = exp(-2|u|) from detail::exp_approx (vec_math.h, float, within 1 ulp; e in (0, 1], no overflow),
//   sigmoid(2u) = 1/(1+e) (u >= 0) or e/(1+e) (u < 0),  1 + tanh(u) = 2 sigmoid(2u),  1 - tanh(u)^2 = 4e/(1+e)^2,
// so y = x sigmoid(2u) without cancellation; the sign select is a blend, the loops vectorize (MCPP_VEC_CLONES).
// Error: rounding -2|u| to float costs |2u| * 6e-8 relative in e. Measured on a dense grid of x in [-6, 6]
// against float64 with a 1e-3 floor: y within 5.8e-7 relative, dx within 6.0e-6 (largest where gelu'(x)
// crosses 0 near x = -0.75 and its two terms cancel); tests/kernels/activations_test.cpp bounds 1e-6 / 1e-5.
#include <algorithm>
#include <cmath>
#include <utility>

#include "mcpp/kernels/cpu/checks.h"
#include "mcpp/kernels/cpu/vec_math.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cpu {
using detail::require_cpu_f32;

namespace {
constexpr double kGeluK = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kGeluC = 0.044715;
constexpr int64_t kParallelMin = 1 << 15;
constexpr int64_t kGeluChunk = 4096;  // elements per OpenMP task (each chunk is one vectorized call)

// e = exp(-2|u|) for the GELU argument u of x; sets sig = sigmoid(2u).
inline double gelu_e(double v, double& sig) {
  const double u = kGeluK * (v + kGeluC * v * v * v);
  const double e = detail::exp_approx(static_cast<float>(-2.0 * std::fabs(u)));
  const double inv = 1.0 / (1.0 + e);
  sig = u >= 0.0 ? inv : e * inv;  // blend (both sides computed)
  return e;
}

MCPP_VEC_CLONES void gelu_fwd_chunk(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    double sig;
    gelu_e(v, sig);
    y[i] = static_cast<float>(v * sig);  // 0.5 v (1 + tanh u)
  }
}

MCPP_VEC_CLONES void gelu_bwd_chunk(float* dx, const float* dy, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    double sig;
    const double e = gelu_e(v, sig);
    const double one_minus_t2 = 4.0 * e / ((1.0 + e) * (1.0 + e));
    const double d = sig + 0.5 * v * one_minus_t2 * kGeluK * (1.0 + 3.0 * kGeluC * v * v);
    dx[i] = static_cast<float>(dy[i] * d);
  }
}

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
  const int64_t chunks = (n + kGeluChunk - 1) / kGeluChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t c = 0; c < chunks; ++c)
    gelu_fwd_chunk(py + c * kGeluChunk, px + c * kGeluChunk, std::min(kGeluChunk, n - c * kGeluChunk));
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
  const int64_t chunks = (n + kGeluChunk - 1) / kGeluChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t c = 0; c < chunks; ++c)
    gelu_bwd_chunk(pdx + c * kGeluChunk, pdy + c * kGeluChunk, px + c * kGeluChunk,
                   std::min(kGeluChunk, n - c * kGeluChunk));
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
