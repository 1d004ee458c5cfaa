// CUDA elementwise ops over flat tensors (same numel, contiguous), float32 / bfloat16 / float16 I/O with
// float32 math (kernels in elementwise_kernels.cu):
//   add:           out = a + b      (out may alias a or b)
//   add_inplace:   y += x
//   scale_inplace: y *= alpha
//   bias_add_inplace: y[n, m] += bias[m]
//   cast:          out = in converted between f32 / bf16 / f16 (round to nearest even, as core/dtype.h);
//                  the same dtype is a device copy.
// Outputs overwritten as named; asynchronous on stream_of(stream).
#include "mcpp/kernels/cuda/cuda_check.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cuda {
using namespace cuda_detail;

void add(Tensor& out, const Tensor& a, const Tensor& b, Stream stream) {
  const FOut o = fout_of("add", "out", out);
  const FIn fa = fin_of("add", "a", a), fb = fin_of("add", "b", b);
  require_numel("add", "a", a, out.numel(), "numel of out");
  require_numel("add", "b", b, out.numel(), "numel of out");
  launch_add(o, fa, fb, out.numel(), stream_of(stream));
}

void add_inplace(Tensor& y, const Tensor& x, Stream stream) {
  const FOut fy = fout_of("add_inplace", "y", y);
  const FIn fx = fin_of("add_inplace", "x", x);
  require_numel("add_inplace", "x", x, y.numel(), "numel of y");
  launch_axpby_inplace(fy, fx, 1.0f, 1.0f, y.numel(), stream_of(stream));
}

void scale_inplace(Tensor& y, float alpha, Stream stream) {
  const FOut fy = fout_of("scale_inplace", "y", y);
  launch_axpby_inplace(fy, FIn{fy.p, fy.kind}, alpha, 0.0f, y.numel(), stream_of(stream));
}

void bias_add_inplace(Tensor& y, const Tensor& bias, Stream stream) {
  const FOut fy = fout_of("bias_add_inplace", "y", y);
  const int64_t m = bias.numel();
  MCPP_CHECK(m > 0 && y.numel() % m == 0 && y.size(-1) == m, "bias_add_inplace: bias {} does not match y {}",
             bias.str(), y.str());
  launch_bias_add_inplace(fy, fin_of("bias_add_inplace", "bias", bias), y.numel() / m, m, stream_of(stream));
}

void cast(Tensor& out, const Tensor& in, Stream stream) {
  const FOut o = fout_of("cast", "out", out);
  const FIn i = fin_of("cast", "in", in);
  require_numel("cast", "out", out, in.numel(), "numel of in");
  if (in.numel() == 0) return;
  if (o.kind == i.kind) {
    if (out.raw() != in.raw())
      MCPP_CUDA_CHECK(cudaMemcpyAsync(out.raw(), in.raw(), in.nbytes(), cudaMemcpyDeviceToDevice, stream_of(stream)));
    return;
  }
  launch_cast(o, i, in.numel(), stream_of(stream));
}

}  // namespace mcpp::ops::cuda
