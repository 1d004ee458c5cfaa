// Device code for rope.cpp: one thread per rotated pair (i, i + half) of one (s, b, head) row, plus a copy
// of the pass-through dims >= 2*half. Each pair is read before it is written, so y may alias x.
//   sign +1: y1 = x1 c - x2 s, y2 = x2 c + x1 s;   sign -1 (backward, the transpose): s -> -s.
#include "mcpp/kernels/cuda/device_utils.cuh"

namespace mcpp::cuda_detail {
namespace {
constexpr int kThreads = 256;

__global__ void rope_kernel(FOut y, FIn x, const float* cosv, const float* sinv, int64_t b, int64_t heads, int64_t d,
                            int64_t half, float sign, int64_t rows) {
  const int64_t per_row = d - half;  // half pairs + (d - 2 half) pass-through dims
  MCPP_GRID_STRIDE(idx, rows * per_row) {
    const int64_t row = idx / per_row, i = idx - row * per_row;  // row = (s*b + bb) * heads + head
    const int64_t pos = row / (b * heads);
    const int64_t base = row * d;
    if (i < half) {
      const float c = cosv[pos * half + i], sn = sign * sinv[pos * half + i];
      const float x1 = x[base + i], x2 = x[base + i + half];
      y.set(base + i, x1 * c - x2 * sn);
      y.set(base + i + half, x2 * c + x1 * sn);
    } else {
      const int64_t j = i + half;  // dims 2*half .. d-1
      y.set(base + j, x[base + j]);
    }
  }
}
}  // namespace

void launch_rope(FOut y, FIn x, const float* cos, const float* sin, int64_t s_len, int64_t b, int64_t heads,
                 int64_t d, int64_t half, float sign, cudaStream_t s) {
  const int64_t rows = s_len * b * heads;
  if (rows <= 0 || d <= 0) return;
  rope_kernel<<<grid_for(rows * (d - half), kThreads), kThreads, 0, s>>>(y, x, cos, sin, b, heads, d, half, sign,
                                                                          rows);
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
