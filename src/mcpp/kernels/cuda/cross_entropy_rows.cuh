// Row pieces shared by the cross entropy kernels (softmax_kernels.cu) and the vocab-parallel ones
// (vocab_parallel_ce_kernels.cu): one block per row of v logits, float32 math.
//   ce_row_max_sum<Vec>: the row's online (max, sum of exp(x - max)), merged over the block (thread 0 holds
//       it on return). Vec: 16-byte loads of 8 elements, kUnroll in flight per thread, blockDim.x ==
//       kCeThreads (the caller checked vec8_ok: v % 8 == 0, 16-byte aligned); else one element per step.
//   ce_row_grad<Vec>: dx = (exp(x - l) - onehot(t)) * g over the row (t outside [0, v): no one-hot — the
//       vocab-parallel case, the target on another rank's shard); element by element, so dx may alias x.
#pragma once
#include "mcpp/kernels/cuda/device_utils.cuh"

namespace mcpp::cuda_detail {

constexpr int kCeThreads = 256, kUnroll = 4;  // vector path
constexpr int kCeScalarThreads = 512;         // scalar path

// Folds 8 values into the thread's running (m, s).
__device__ __forceinline__ void online_add8(float& m, float& s, const float (&v)[8]) {
  float c = v[0];
#pragma unroll
  for (int e = 1; e < 8; ++e) c = fmaxf(c, v[e]);
  const float mn = fmaxf(m, c);
  if (mn == -INFINITY) {  // every value so far -inf; a NaN chunk still poisons the sum
    if (c != c || v[0] != v[0]) s = NAN;
    return;
  }
  float t = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) t += __expf(v[e] - mn);
  s = s * __expf(m - mn) + t;
  m = mn;
}

// Vector path: calls f(c, j) for every 8-element chunk j of row r (c: its values as float[8], loaded with
// 16-byte loads; columns 8j .. 8j + 7), kUnroll chunks loaded per thread before f runs on them.
template <class F>
__device__ __forceinline__ void for_each_chunk8(const FIn& x, int64_t r, int64_t v, F&& f) {
  const int64_t vecs = v / 8, vbase = r * vecs;
  int64_t j = threadIdx.x;
  for (; j + (kUnroll - 1) * kCeThreads < vecs; j += kUnroll * kCeThreads) {
    float c[kUnroll][8];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) load8(x, vbase + j + u * kCeThreads, c[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) f(c[u], j + u * kCeThreads);
  }
  for (; j < vecs; j += kCeThreads) {
    float c[8];
    load8(x, vbase + j, c);
    f(c, j);
  }
}

template <bool Vec>
__device__ __forceinline__ void ce_row_max_sum(const FIn& x, int64_t r, int64_t v, float& m, float& s, float* sm,
                                               float* ss) {
  if constexpr (Vec) {
    for_each_chunk8(x, r, v, [&](float (&c)[8], int64_t) { online_add8(m, s, c); });
  } else {
    const int64_t base = r * v;
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
      const float xv = x[base + j];
      if (xv > m) {
        s = s * __expf(m - xv) + 1.0f;
        m = xv;
      } else {
        s += __expf(xv - m);
      }
    }
  }
  block_online_merge(m, s, sm, ss);
}

template <bool Vec>
__device__ __forceinline__ void ce_row_grad(const FOut& dx, const FIn& x, int64_t r, int64_t v, float l, float g,
                                            int64_t t) {
  if constexpr (Vec) {
    const int64_t vbase = r * (v / 8);
    for_each_chunk8(x, r, v, [&](float (&c)[8], int64_t j) {
#pragma unroll
      for (int e = 0; e < 8; ++e) c[e] = (__expf(c[e] - l) - (j * 8 + e == t ? 1.0f : 0.0f)) * g;
      store8(dx, vbase + j, c);
    });
  } else {
    const int64_t base = r * v;
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
      const float pj = __expf(x[base + j] - l);
      dx.set(base + j, (pj - (j == t ? 1.0f : 0.0f)) * g);
    }
  }
}

}  // namespace mcpp::cuda_detail
