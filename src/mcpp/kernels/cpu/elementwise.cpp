// CPU elementwise ops over flat tensors (any shape; compared by element count, contiguous row-major).
//
//   add:           out = a + b           (fp32; out may alias a or b)
//   add_inplace:   y += x                (fp32; y and x same numel)
//   scale_inplace: y *= alpha            (fp32)
//   bias_add_inplace: y[n, m] += bias[m] (fp32; every row)
//   cast:          out = in converted    (any of f32 / bf16 / f16 to any; bf16 and f16 rounding is
//                                         round-to-nearest-even via core/dtype.h; same dtype copies)
// No output accumulates beyond what the name says. Parallel over elements (OpenMP) above 64K elements;
// every element is independent, so results do not depend on the thread count.
#include <cstring>

#include "mcpp/kernels/cpu/checks.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cpu {
using detail::require_cpu_f32;

namespace {
constexpr int64_t kParallelMin = 1 << 16;  // below this the OpenMP fork costs more than the loop
}

void add(Tensor& out, const Tensor& a, const Tensor& b, Stream) {
  require_cpu_f32("add", "out", out);
  require_cpu_f32("add", "a", a);
  require_cpu_f32("add", "b", b);
  detail::require_numel("add", "a", a, out.numel(), "numel of out");
  detail::require_numel("add", "b", b, out.numel(), "numel of out");
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* po = out.data<float>();
  const int64_t n = out.numel();
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) po[i] = pa[i] + pb[i];
}

void add_inplace(Tensor& y, const Tensor& x, Stream) {
  require_cpu_f32("add_inplace", "y", y);
  require_cpu_f32("add_inplace", "x", x);
  detail::require_numel("add_inplace", "x", x, y.numel(), "numel of y");
  const float* px = x.data<float>();
  float* py = y.data<float>();
  const int64_t n = y.numel();
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) py[i] += px[i];
}

void scale_inplace(Tensor& y, float alpha, Stream) {
  require_cpu_f32("scale_inplace", "y", y);
  float* py = y.data<float>();
  const int64_t n = y.numel();
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) py[i] *= alpha;
}

void bias_add_inplace(Tensor& y, const Tensor& bias, Stream) {
  require_cpu_f32("bias_add_inplace", "y", y);
  require_cpu_f32("bias_add_inplace", "bias", bias);
  const int64_t m = bias.numel();
  MCPP_CHECK(m > 0 && y.size(-1) == m, "bias_add_inplace: bias {} does not match the last dim of y {}", bias.str(),
             y.str());
  const int64_t n = y.numel() / m;
  float* py = y.data<float>();
  const float* pb = bias.data<float>();
#pragma omp parallel for schedule(static) if (n * m > kParallelMin)
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < m; ++j) py[r * m + j] += pb[j];
}

void cast(Tensor& out, const Tensor& in, Stream) {
  auto is_float = [](DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; };
  MCPP_CHECK(out.defined() && in.defined(), "cast: undefined tensor (out {}, in {})",
             out.defined() ? out.str() : "undefined", in.defined() ? in.str() : "undefined");
  MCPP_CHECK(out.is_cpu() && in.is_cpu(), "cast: CPU tensors expected; got out {}, in {}", out.str(), in.str());
  MCPP_CHECK(is_float(out.dtype()) && is_float(in.dtype()),
             "cast: converts between float32 / bfloat16 / float16; got out {}, in {}", out.str(), in.str());
  detail::require_numel("cast", "out", out, in.numel(), "numel of in");
  const int64_t n = in.numel();
  if (out.dtype() == in.dtype()) {
    if (out.raw() != in.raw()) std::memmove(out.raw(), in.raw(), in.nbytes());
    return;
  }
  const DType from = in.dtype(), to = out.dtype();
  const void* src = in.raw();
  void* dst = out.raw();
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    float f = from == DType::F32    ? static_cast<const float*>(src)[i]
              : from == DType::BF16 ? bf16_to_f32(static_cast<const uint16_t*>(src)[i])
                                    : f16_to_f32(static_cast<const uint16_t*>(src)[i]);
    if (to == DType::F32) static_cast<float*>(dst)[i] = f;
    else if (to == DType::BF16) static_cast<uint16_t*>(dst)[i] = f32_to_bf16(f);
    else static_cast<uint16_t*>(dst)[i] = f32_to_f16(f);
  }
}

}  // namespace mcpp::ops::cpu
