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

// Rotates 8 pairs (x1[e], x2[e]) in place by the angles of chunk t of cos / sin [s, half] (t = pos * half8 + c). The
// one rotation of the vector kernels below, so the fused split / merge give rope_vec_kernel's bits.
__device__ __forceinline__ void rotate8(const float* cosv, const float* sinv, int64_t t, float sign, float (&x1)[8],
                                        float (&x2)[8]) {
  const float4* c4 = reinterpret_cast<const float4*>(cosv);
  const float4* s4 = reinterpret_cast<const float4*>(sinv);
  const float4 c0 = c4[2 * t], c1 = c4[2 * t + 1], s0 = s4[2 * t], s1 = s4[2 * t + 1];
  const float cs[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
  const float sn[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float se = sign * sn[e];
    const float y1 = x1[e] * cs[e] - x2[e] * se;
    const float y2 = x2[e] * cs[e] + x1[e] * se;
    x1[e] = y1;
    x2[e] = y2;
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
      float x1[8], x2[8];
      load8(x, base + c, x1);
      load8(x, base + half8 + c, x2);
      rotate8(cosv, sinv, (row / bh) * half8 + c, sign, x1, x2);
      store8(y, base + c, x1);
      store8(y, base + half8 + c, x2);
    } else {
      float v[8];
      load8(x, base + half8 + c, v);  // chunk 2 half8 + (c - half8)
      store8(y, base + half8 + c, v);
    }
  }
}

// qkv_split_rope (kSplit) / qkv_merge_rope: the fused QKV rows qkv[s, b, ng * (r + 2) * d] (per query group [q_0 ..
// q_{r-1}, k, v]) to / from q[s, b, nq, d], k / v[s, b, ng, d], the q and k rows rotated (sign +1 / -1), the v rows
// copied; items as rope_vec_kernel's, per fused row. Row = (t * ng + g) * (r + 2) + slot, t = s_i * b + b_i.
// Index math in I (int32 when every chunk index fits: 32-bit divisions, ~4x cheaper than 64-bit ones; 4 a thread).
template <bool kSplit, typename I>
__global__ void qkv_rope_vec_kernel(FOut out_fused, FOut out_q, FOut out_k, FOut out_v, FIn in_fused, FIn in_q,
                                    FIn in_k, FIn in_v, const float* cosv, const float* sinv, QkvShape a, I b, I d8,
                                    I half8, I per_row, I n) {
  const I r = static_cast<I>(a.nq / a.ng), ng = static_cast<I>(a.ng), nq = static_cast<I>(a.nq);
  for (I idx = static_cast<I>(blockIdx.x * blockDim.x + threadIdx.x); idx < n;
       idx += static_cast<I>(gridDim.x * blockDim.x)) {
    const I row = idx / per_row, c = idx - row * per_row;
    const I tg = row / (r + 2), slot = row - tg * (r + 2), t = tg / ng;
    const I head = (slot < r ? t * nq + (tg - t * ng) * r + slot : tg) * d8;  // the row in q, k or v
    const I fused = row * d8;
    const FIn& hin = slot < r ? in_q : slot == r ? in_k : in_v;
    const FOut& hout = slot < r ? out_q : slot == r ? out_k : out_v;
    const FIn& src = kSplit ? in_fused : hin;
    const FOut& dst = kSplit ? hout : out_fused;
    const I from = kSplit ? fused : head, to = kSplit ? head : fused;
    if (c < half8) {
      float x1[8], x2[8];
      load8(src, from + c, x1);
      load8(src, from + half8 + c, x2);
      if (slot <= r) rotate8(cosv, sinv, (t / b) * half8 + c, kSplit ? 1.0f : -1.0f, x1, x2);
      store8(dst, to + c, x1);
      store8(dst, to + half8 + c, x2);
    } else {
      float v[8];
      load8(src, from + half8 + c, v);
      store8(dst, to + half8 + c, v);
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

bool launch_qkv_rope(bool split, FOut fused_out, FOut q_out, FOut k_out, FOut v_out, FIn fused_in, FIn q_in, FIn k_in,
                     FIn v_in, const float* cos, const float* sin, const QkvShape& a, int64_t b, int64_t half,
                     cudaStream_t s) {
  const int64_t rows = a.sb * (a.nq + 2 * a.ng);
  if (half % 8 != 0 || half == 0 ||
      !vec8_ok(a.d, {fused_out.p, q_out.p, k_out.p, v_out.p, fused_in.p, q_in.p, k_in.p, v_in.p}) ||
      !vec8_ok(half, {cos, sin}))
    return false;
  const int64_t d8 = a.d / 8, half8 = half / 8, per_row = d8 - half8, n = rows * per_row;
  if (n <= 0) return true;
  const auto launch = [&](auto kernel, auto i) {
    using I = decltype(i);
    kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(fused_out, q_out, k_out, v_out, fused_in, q_in, k_in, v_in, cos,
                                                      sin, a, static_cast<I>(b), static_cast<I>(d8),
                                                      static_cast<I>(half8), static_cast<I>(per_row), static_cast<I>(n));
  };
  // int32 indices when every chunk index and the grid-stride loop's last step (grid_for's cap) fit
  const bool narrow = rows * d8 + int64_t{65535} * 16 * kThreads < (int64_t{1} << 31);
  if (narrow && split) launch(qkv_rope_vec_kernel<true, int32_t>, int32_t{});
  else if (narrow) launch(qkv_rope_vec_kernel<false, int32_t>, int32_t{});
  else if (split) launch(qkv_rope_vec_kernel<true, int64_t>, int64_t{});
  else launch(qkv_rope_vec_kernel<false, int64_t>, int64_t{});
  MCPP_CUDA_LAUNCH_CHECK();
  return true;
}

}  // namespace mcpp::cuda_detail
