// Device code for rope.cpp. Each pair is read before it is written, so y may alias x.
//   sign +1: y1 = x1 c - x2 s, y2 = x2 c + x1 s;   sign -1 (backward, the transpose): s -> -s.
// Vector path (half % 8 == 0, d % 8 == 0, x, y, cos, sin 16-byte aligned — every Llama-style head dim): one thread
// per 8 consecutive pairs of a (s, b, head) row (16-byte loads and stores of x1 and x2, cos / sin as float4) or per
// 8 pass-through dims >= 2 half. Otherwise one thread per pair (i, i + half), plus a copy of the pass-through dims.
// (The per-pair kernel with 2-byte accesses and two 64-bit divisions per element ran ~1 TB/s on the 1.3B q / k.)
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

// n = rows * per_row items, per_row = half8 + (d8 - 2 half8): item c < half8 rotates pairs [8c, 8c + 8), the others
// copy a pass-through chunk. Chunk indices are in units of 8 elements (load8 / store8).
__global__ void rope_vec_kernel(FOut y, FIn x, const float* cosv, const float* sinv, int64_t bh, int64_t d8,
                                int64_t half8, int64_t per_row, float sign, int64_t n) {
  MCPP_GRID_STRIDE(idx, n) {
    const int64_t row = idx / per_row, c = idx - row * per_row;  // row = (s*b + bb) * heads + head
    const int64_t base = row * d8;
    if (c < half8) {
      const int64_t t = (row / bh) * half8 + c;  // the 8 angles' chunk in cos / sin [s, half]
      const float4* c4 = reinterpret_cast<const float4*>(cosv);
      const float4* s4 = reinterpret_cast<const float4*>(sinv);
      const float4 c0 = c4[2 * t], c1 = c4[2 * t + 1], s0 = s4[2 * t], s1 = s4[2 * t + 1];
      const float cs[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
      const float sn[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
      float x1[8], x2[8], y1[8], y2[8];
      load8(x, base + c, x1);
      load8(x, base + half8 + c, x2);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float se = sign * sn[e];
        y1[e] = x1[e] * cs[e] - x2[e] * se;
        y2[e] = x2[e] * cs[e] + x1[e] * se;
      }
      store8(y, base + c, y1);
      store8(y, base + half8 + c, y2);
    } else {
      float v[8];
      load8(x, base + half8 + c, v);  // chunk 2 half8 + (c - half8)
      store8(y, base + half8 + c, v);
    }
  }
}
}  // namespace

void launch_rope(FOut y, FIn x, const float* cos, const float* sin, int64_t s_len, int64_t b, int64_t heads,
                 int64_t d, int64_t half, float sign, cudaStream_t s) {
  const int64_t rows = s_len * b * heads;
  if (rows <= 0 || d <= 0) return;
  if (half % 8 == 0 && vec8_ok(d, {x.p, y.p}) && vec8_ok(half, {cos, sin})) {
    const int64_t d8 = d / 8, half8 = half / 8, per_row = d8 - half8, n = rows * per_row;
    if (n > 0)
      rope_vec_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(y, x, cos, sin, b * heads, d8, half8, per_row, sign,
                                                                 n);
    MCPP_CUDA_LAUNCH_CHECK();
    return;
  }
  rope_kernel<<<grid_for(rows * (d - half), kThreads), kThreads, 0, s>>>(y, x, cos, sin, b, heads, d, half, sign,
                                                                          rows);
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
