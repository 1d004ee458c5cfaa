// CPU rotary position embedding, non-interleaved (rotate_half, as Megatron-Core / HF), fp32.
//
//   rope_fwd: x, y [s, b, heads, d]; cos, sin [s, rot/2] (positions 0..s-1), rot = 2 * cos.size(1) <= d.
//             for i < rot/2:  y[i]       = x[i] * cos[i] - x[i + rot/2] * sin[i]
//                             y[i+rot/2] = x[i + rot/2] * cos[i] + x[i] * sin[i]
//             dims >= rot pass through unchanged.
//   rope_bwd: the transpose rotation: dx[i] = dy[i] cos + dy[i+rot/2] sin;
//             dx[i+rot/2] = dy[i+rot/2] cos - dy[i] sin.
// Outputs overwritten; y may alias x (each pair is read before it is written). Parallel over (s, b).
#include "mcpp/kernels/cpu/checks.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cpu {
using detail::require_cpu_f32;

namespace {
// sign = +1 applies the rotation by +theta (forward), -1 its transpose (backward).
void rope_apply(const char* op, Tensor& out, const char* out_name, const Tensor& in, const char* in_name,
                const Tensor& cos, const Tensor& sin, float sign) {
  require_cpu_f32(op, out_name, out);
  require_cpu_f32(op, in_name, in);
  require_cpu_f32(op, "cos", cos);
  require_cpu_f32(op, "sin", sin);
  MCPP_CHECK(in.ndim() == 4, "{}: {} must be [s, b, heads, d]; got {}", op, in_name, in.str());
  detail::require_same_shape(op, out_name, out, in_name, in);
  const int64_t s = in.size(0), b = in.size(1), heads = in.size(2), d = in.size(3);
  MCPP_CHECK(cos.ndim() == 2 && cos.size(0) == s, "{}: cos must be [s={}, rot/2]; got {}", op, s, cos.str());
  detail::require_same_shape(op, "sin", sin, "cos", cos);
  const int64_t half = cos.size(1);
  MCPP_CHECK(2 * half <= d, "{}: rotary dim 2*cos.size(1) = {} exceeds head dim d = {} of {}", op, 2 * half, d,
             in.str());
  const float* px = in.data<float>();
  const float* pc = cos.data<float>();
  const float* ps = sin.data<float>();
  float* py = out.data<float>();
  const bool alias = out.raw() == in.raw();
#pragma omp parallel for schedule(static) if (in.numel() > (1 << 15))
  for (int64_t sb = 0; sb < s * b; ++sb) {
    const float* c = pc + (sb / b) * half;  // [rot/2] for position sb / b
    const float* sn = ps + (sb / b) * half;
    for (int64_t hd = 0; hd < heads; ++hd) {
      const float* xr = px + (sb * heads + hd) * d;
      float* yr = py + (sb * heads + hd) * d;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = xr[i], x2 = xr[i + half], si = sign * sn[i];
        yr[i] = x1 * c[i] - x2 * si;
        yr[i + half] = x2 * c[i] + x1 * si;
      }
      if (!alias)
        for (int64_t i = 2 * half; i < d; ++i) yr[i] = xr[i];
    }
  }
}
}  // namespace

void rope_fwd(Tensor& y, const Tensor& x, const Tensor& cos, const Tensor& sin, Stream) {
  rope_apply("rope_fwd", y, "y", x, "x", cos, sin, 1.0f);
}

void rope_bwd(Tensor& dx, const Tensor& dy, const Tensor& cos, const Tensor& sin, Stream) {
  rope_apply("rope_bwd", dx, "dx", dy, "dy", cos, sin, -1.0f);
}

}  // namespace mcpp::ops::cpu
