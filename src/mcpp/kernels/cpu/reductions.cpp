// CPU reductions used by gradient clipping and the loss scaler.
//
//   sum_of_squares: sum_i x_i^2 of a float32 tensor, accumulated in float64. Deterministic: fixed
//                   16K-element chunks are summed (each in order) into per-chunk partials, and the
//                   partials are added in chunk order — the result is independent of the thread count.
//   has_non_finite: true when any element of a float32 tensor is NaN or +-inf (exponent bits all ones,
//                   tested on the bit pattern so it holds under any floating-point flags).
#include <cstring>
#include <vector>

#include "mcpp/kernels/cpu/checks.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cpu {

double sum_of_squares(const Tensor& x, Stream) {
  detail::require_cpu_f32("sum_of_squares", "x", x);
  constexpr int64_t kChunk = 1 << 14;
  const int64_t n = x.numel();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const float* p = x.data<float>();
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t i1 = std::min(n, (c + 1) * kChunk);
    double s = 0.0;
    for (int64_t i = c * kChunk; i < i1; ++i) s += static_cast<double>(p[i]) * p[i];
    partial[static_cast<size_t>(c)] = s;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

bool has_non_finite(const Tensor& x, Stream) {
  detail::require_cpu_f32("has_non_finite", "x", x);
  const int64_t n = x.numel();
  const uint32_t* bits = static_cast<const uint32_t*>(x.raw());
  int found = 0;
#pragma omp parallel for schedule(static) reduction(| : found) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) found |= (bits[i] & 0x7f800000u) == 0x7f800000u;
  return found != 0;
}

}  // namespace mcpp::ops::cpu
