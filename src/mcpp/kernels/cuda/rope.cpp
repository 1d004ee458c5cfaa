// CUDA rotary position embedding, non-interleaved (rotate_half), rope_kernels.cu.
//   rope_fwd: x, y [s, b, heads, d] (float32 / bf16); cos, sin float32 [s, rot/2], rot = 2 * cos.size(1) <= d.
//             y[i] = x[i] cos[i] - x[i+rot/2] sin[i];  y[i+rot/2] = x[i+rot/2] cos[i] + x[i] sin[i]; dims >= rot
//             pass through.
//   rope_bwd: the transpose rotation (sin -> -sin). Outputs overwritten; y may alias x. Async on the stream.
#include "mcpp/kernels/cuda/cuda_check.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cuda {
using namespace cuda_detail;

namespace {
void rope_apply(const char* op, Tensor& out, const char* out_name, const Tensor& in, const char* in_name,
                const Tensor& cos, const Tensor& sin, float sign, Stream stream) {
  const FOut o = fout_of(op, out_name, out);
  const FIn i = fin_of(op, in_name, in);
  require_float(op, "cos", cos, /*bf16_ok=*/false);
  require_float(op, "sin", sin, /*bf16_ok=*/false);
  MCPP_CHECK(in.ndim() == 4, "{}: {} must be [s, b, heads, d]; got {}", op, in_name, in.str());
  require_same_shape(op, out_name, out, in_name, in);
  const int64_t s = in.size(0), b = in.size(1), heads = in.size(2), d = in.size(3);
  MCPP_CHECK(cos.ndim() == 2 && cos.size(0) == s, "{}: cos must be [s={}, rot/2]; got {}", op, s, cos.str());
  require_same_shape(op, "sin", sin, "cos", cos);
  const int64_t half = cos.size(1);
  MCPP_CHECK(2 * half <= d, "{}: rotary dim 2*cos.size(1) = {} exceeds head dim d = {} of {}", op, 2 * half, d,
             in.str());
  launch_rope(o, i, cos.data<float>(), sin.data<float>(), s, b, heads, d, half, sign, stream_of(stream));
}
}  // namespace

void rope_fwd(Tensor& y, const Tensor& x, const Tensor& cos, const Tensor& sin, Stream stream) {
  rope_apply("rope_fwd", y, "y", x, "x", cos, sin, 1.0f, stream);
}

void rope_bwd(Tensor& dx, const Tensor& dy, const Tensor& cos, const Tensor& sin, Stream stream) {
  rope_apply("rope_bwd", dx, "dx", dy, "dy", cos, sin, -1.0f, stream);
}

}  // namespace mcpp::ops::cuda
