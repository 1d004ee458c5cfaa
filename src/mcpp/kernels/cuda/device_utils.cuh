// Device-side helpers for the CUDA kernels (*.cu only): grid sizing and warp/block reductions.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "mcpp/kernels/cuda/launch.h"

namespace mcpp::cuda_detail {

// Grid for a flat launch of n items with `threads` per block (capped; kernels grid-stride).
inline unsigned grid_for(int64_t n, int threads) {
  int64_t g = (n + threads - 1) / threads;
  if (g < 1) g = 1;
  if (g > 65535LL * 16) g = 65535LL * 16;
  return static_cast<unsigned>(g);
}

#define MCPP_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// `scratch`: 33 values of T in shared memory. Synchronizes the block three times (scratch reusable after).
template <typename T>
__device__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lane < nwarps ? scratch[lane] : T(0);
    w = warp_sum(w);
    if (lane == 0) scratch[32] = w;
  }
  __syncthreads();
  T r = scratch[32];
  __syncthreads();
  return r;
}

// Exclusive prefix of v over the block's kThreads threads (blockDim.x == kThreads; an inclusive Hillis-Steele scan
// in `scan`, kThreads ints of shared memory); *total = the block's sum. Every thread calls it; scan is reusable when
// it returns. Deterministic: the ordered compactions (embedding backward, MoE route rows) build on it.
template <int kThreads>
__device__ int block_exclusive_scan(int v, int32_t* scan, int* total) {
  scan[threadIdx.x] = v;
  __syncthreads();
  for (int off = 1; off < kThreads; off <<= 1) {
    const int add = threadIdx.x >= off ? scan[threadIdx.x - off] : 0;
    __syncthreads();
    scan[threadIdx.x] += add;
    __syncthreads();
  }
  const int excl = scan[threadIdx.x] - v;
  *total = scan[kThreads - 1];
  __syncthreads();
  return excl;
}

// Online softmax state (m, s): s = sum exp(x - m) over the values seen. Merges (m2, s2) into (m, s).
__device__ __forceinline__ void online_merge(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  if (mn == -INFINITY) return;
  s = s * __expf(m - mn) + s2 * __expf(m2 - mn);
  m = mn;
}

// Merges every thread's (m, s) over the block (blockDim.x a multiple of 32, <= 1024): warp shuffles, then the
// warps' states in order. Only thread 0's (m, s) hold the block's state on return. `sm`, `ss`: 32 floats each
// in shared memory. Synchronizes the block once.
__device__ __forceinline__ void block_online_merge(float& m, float& s, float* sm, float* ss) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    online_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    m = -INFINITY, s = 0.0f;
    for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) online_merge(m, s, sm[w], ss[w]);
  }
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_max(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < nwarps ? scratch[lane] : -INFINITY;
    w = warp_max(w);
    if (lane == 0) scratch[32] = w;
  }
  __syncthreads();
  float r = scratch[32];
  __syncthreads();
  return r;
}

// ---- 8-wide vector access: elements [8j, 8j + 8) of a float32 / bf16 / f16 buffer with 16-byte loads
// and stores (one for 2-byte types, two for float32). Bandwidth-bound elementwise kernels use it when
// vec8_ok() holds; otherwise they take their scalar (FIn / FOut per element) path.
inline bool vec8_ok(int64_t n, std::initializer_list<const void*> ptrs) {
  if (n % 8 != 0) return false;
  for (const void* p : ptrs)
    if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// 8 packed 2-byte values (kind kBF16 or kF16) -> float.
__device__ __forceinline__ void unpack8(const uint4& w, int kind, float (&v)[8]) {
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (kind == kBF16) {
      const __nv_bfloat162 h = *reinterpret_cast<const __nv_bfloat162*>(&u[k]);
      v[2 * k] = __low2float(h), v[2 * k + 1] = __high2float(h);
    } else {
      const __half2 h = *reinterpret_cast<const __half2*>(&u[k]);
      v[2 * k] = __low2float(h), v[2 * k + 1] = __high2float(h);
    }
  }
}

__device__ __forceinline__ void load8(const FIn& x, int64_t j, float (&v)[8]) {
  if (x.kind == kF32) {
    const float4 a = static_cast<const float4*>(x.p)[2 * j], b = static_cast<const float4*>(x.p)[2 * j + 1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    return;
  }
  unpack8(static_cast<const uint4*>(x.p)[j], x.kind, v);
}

__device__ __forceinline__ void store8(const FOut& y, int64_t j, const float (&v)[8]) {
  if (y.kind == kF32) {
    static_cast<float4*>(y.p)[2 * j] = make_float4(v[0], v[1], v[2], v[3]);
    static_cast<float4*>(y.p)[2 * j + 1] = make_float4(v[4], v[5], v[6], v[7]);
    return;
  }
  uint32_t u[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (y.kind == kBF16) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
      u[k] = *reinterpret_cast<const uint32_t*>(&h);
    } else {
      const __half2 h = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
      u[k] = *reinterpret_cast<const uint32_t*>(&h);
    }
  }
  static_cast<uint4*>(y.p)[j] = make_uint4(u[0], u[1], u[2], u[3]);
}

}  // namespace mcpp::cuda_detail
