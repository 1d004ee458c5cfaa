// CUDA activations and dropout: float32 / bfloat16 / float16 I/O, float32 math (activations_kernels.cu).
//   gelu_fwd / gelu_bwd:     tanh-approximation GELU (Megatron's openai_gelu / bias_gelu); same numel.
//   swiglu_fwd / swiglu_bwd: x[.., 2f] = [gate | up]; y[.., f] = silu(gate) * up; dx[.., 2f] = [dgate | dup].
//   dropout_fwd / dropout_bwd: keep element i iff philox_uniform_at(key, i) >= p (core/rng.h; the same
//     mask as the CPU backend, bit for bit), kept values scaled by 1/(1-p); p == 0 copies, p == 1 zeros.
//     The mask is regenerated from the key in backward, never stored.
//   random_normal / random_scale: ops.inc's definitions (random_scale bitwise the CPU's; random_normal float32 /
//     bf16 out). A CUDA-graph key's device base is read when the kernels run.
// Outputs overwritten (dx may alias dy for GELU and dropout); asynchronous on stream_of(stream).
#include <cmath>

#include "mcpp/kernels/cuda/cuda_check.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cuda {
using namespace cuda_detail;

namespace {
// x [.., 2f] and y [.., f] with the same leading dims; returns {rows, f}.
std::pair<int64_t, int64_t> swiglu_dims(const char* op, const Tensor& x, const Tensor& y, const char* y_name) {
  const int64_t two_f = last_dim(op, "x", x);
  MCPP_CHECK(two_f % 2 == 0, "{}: x last dim must be 2*f ([gate | up]); got {}", op, x.str());
  Shape want = x.shape();
  want.back() = two_f / 2;
  MCPP_CHECK(y.shape() == want, "{}: {} must be {} for x {}; got {}", op, y_name, shape_str(want), x.str(), y.str());
  const int64_t f = two_f / 2;
  return {f ? y.numel() / f : 0, f};
}

void dropout_apply(const char* op, Tensor& out, const char* out_name, const Tensor& in, const char* in_name, float p,
                   const PhiloxKey& key, Stream stream) {
  const FOut o = fout_of(op, out_name, out);
  const FIn i = fin_of(op, in_name, in);
  require_numel(op, in_name, in, out.numel(), "numel of the output");
  MCPP_CHECK(p >= 0.0f && p <= 1.0f, "{}: dropout probability p must be in [0, 1]; got {}", op, p);
  if (p == 0.0f) {
    cast(out, in, stream);
    return;
  }
  const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  launch_dropout(o, i, p, scale, key.seed, key.offset, key.device_base, out.numel(), stream_of(stream));
}
}  // namespace

void gelu_fwd(Tensor& y, const Tensor& x, Stream stream) {
  const FOut fy = fout_of("gelu_fwd", "y", y);
  const FIn fx = fin_of("gelu_fwd", "x", x);
  require_numel("gelu_fwd", "x", x, y.numel(), "numel of y");
  launch_gelu_fwd(fy, fx, y.numel(), stream_of(stream));
}

void gelu_bwd(Tensor& dx, const Tensor& dy, const Tensor& x, Stream stream) {
  const FOut fdx = fout_of("gelu_bwd", "dx", dx);
  const FIn fdy = fin_of("gelu_bwd", "dy", dy), fx = fin_of("gelu_bwd", "x", x);
  require_numel("gelu_bwd", "dy", dy, dx.numel(), "numel of dx");
  require_numel("gelu_bwd", "x", x, dx.numel(), "numel of dx");
  launch_gelu_bwd(fdx, fdy, fx, dx.numel(), stream_of(stream));
}

void swiglu_fwd(Tensor& y, const Tensor& x, Stream stream) {
  const FOut fy = fout_of("swiglu_fwd", "y", y);
  const FIn fx = fin_of("swiglu_fwd", "x", x);
  const auto [rows, f] = swiglu_dims("swiglu_fwd", x, y, "y");
  launch_swiglu_fwd(fy, fx, rows, f, stream_of(stream));
}

void swiglu_bwd(Tensor& dx, const Tensor& dy, const Tensor& x, Stream stream) {
  const FOut fdx = fout_of("swiglu_bwd", "dx", dx);
  const FIn fdy = fin_of("swiglu_bwd", "dy", dy), fx = fin_of("swiglu_bwd", "x", x);
  const auto [rows, f] = swiglu_dims("swiglu_bwd", x, dy, "dy");
  require_same_shape("swiglu_bwd", "dx", dx, "x", x);
  launch_swiglu_bwd(fdx, fdy, fx, rows, f, stream_of(stream));
}

void dropout_fwd(Tensor& y, const Tensor& x, float p, const PhiloxKey& key, Stream stream) {
  dropout_apply("dropout_fwd", y, "y", x, "x", p, key, stream);
}

void dropout_bwd(Tensor& dx, const Tensor& dy, float p, const PhiloxKey& key, Stream stream) {
  dropout_apply("dropout_bwd", dx, "dx", dy, "dy", p, key, stream);
}

void random_normal(Tensor& out, const PhiloxKey& key, Stream stream) {
  const FOut o = fout_of("random_normal", "out", out);
  MCPP_CHECK(o.kind != kF16, "random_normal: out must be float32 or bf16; got {}", out.str());
  launch_random_normal(o, key.seed, key.offset, key.device_base, out.numel(), stream_of(stream));
}

void random_scale(Tensor& y, const Tensor& x, float lo, float hi, const PhiloxKey& key, Stream stream) {
  const FOut o = fout_of("random_scale", "y", y);
  const FIn i = fin_of("random_scale", "x", x);
  require_numel("random_scale", "x", x, y.numel(), "numel of y");
  MCPP_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, "random_scale: need finite lo <= hi; got [{}, {}]",
             lo, hi);
  launch_random_scale(o, i, lo, hi - lo, key.seed, key.offset, key.device_base, y.numel(), stream_of(stream));
}

}  // namespace mcpp::ops::cuda
