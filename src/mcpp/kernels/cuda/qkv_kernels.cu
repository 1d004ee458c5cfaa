// Device code for qkv.cpp. Fast path (both sides the same 2- or 4-byte dtype, rows of d elements a
// multiple of 16 bytes, 16-byte aligned pointers): one thread moves one 16-byte word of a head row —
// a pure copy, coalesced on both sides. Otherwise one thread per element of the fused QKV tensor,
// converting through float (FIn / FOut).
#include "mcpp/kernels/cuda/device_utils.cuh"

namespace mcpp::cuda_detail {
namespace {
constexpr int kThreads = 256;

// Offset of qkv element `idx` in q (slot < r), k (slot == r) or v (slot == r + 1).
struct QkvPlace {
  int which;  // 0 q, 1 k, 2 v
  int64_t off;
};
__device__ __forceinline__ QkvPlace place(const QkvShape& a, int64_t idx) {
  const int64_t r = a.nq / a.ng;
  const int64_t dc = idx % a.d, row = idx / a.d;
  const int64_t slot = row % (r + 2), tg = row / (r + 2);  // tg = t * ng + g
  const int64_t g = tg % a.ng, t = tg / a.ng;
  if (slot < r) return {0, (t * a.nq + g * r + slot) * a.d + dc};
  return {slot == r ? 1 : 2, tg * a.d + dc};
}

// Row `row` of the fused tensor (= (t * ng + g) * (r + 2) + slot) -> its row in q, k or v.
__device__ __forceinline__ uint4* head_row(const QkvShape& a, int64_t row, int64_t r, int64_t words, uint4* q, uint4* k,
                                           uint4* v) {
  const int64_t slot = row % (r + 2), tg = row / (r + 2);
  if (slot < r) return q + ((tg / a.ng) * a.nq + (tg % a.ng) * r + slot) * words;
  return (slot == r ? k : v) + tg * words;
}

template <bool kSplit>
__global__ void qkv_copy16_kernel(uint4* qkv, uint4* q, uint4* k, uint4* v, QkvShape a, int64_t words, int64_t n) {
  const int64_t r = a.nq / a.ng;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / words, w = i - row * words;
    uint4* h = head_row(a, row, r, words, q, k, v) + w;
    if (kSplit) *h = qkv[i];
    else qkv[i] = *h;
  }
}

// Word count of a head row when the 16-byte copy applies, else 0.
int64_t copy16_words(const void* qkv, const void* q, const void* k, const void* v, int kind_a, int kind_b, int64_t d) {
  if (kind_a != kind_b) return 0;
  const int64_t es = kind_a == kF32 ? 4 : 2;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if ((d * es) % 16 != 0 || !aligned(qkv) || !aligned(q) || !aligned(k) || !aligned(v)) return 0;
  return d * es / 16;
}

__global__ void qkv_split_kernel(FOut q, FOut k, FOut v, FIn qkv, QkvShape a, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const QkvPlace p = place(a, i);
    (p.which == 0 ? q : p.which == 1 ? k : v).set(p.off, qkv[i]);
  }
}

__global__ void qkv_merge_kernel(FOut qkv, FIn q, FIn k, FIn v, QkvShape a, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const QkvPlace p = place(a, i);
    qkv.set(i, (p.which == 0 ? q : p.which == 1 ? k : v)[p.off]);
  }
}
}  // namespace

namespace {
// The 16-byte copy when it applies (same dtype everywhere, aligned rows); false: use the converting kernel.
template <bool kSplit>
bool launch_copy16(const void* qkv, const void* q, const void* k, const void* v, int kind_qkv, int kind_q,
                   int kind_k, int kind_v, const QkvShape& a, int64_t n, cudaStream_t s) {
  const int64_t words = kind_q == kind_k && kind_q == kind_v ? copy16_words(qkv, q, k, v, kind_qkv, kind_q, a.d) : 0;
  if (words == 0) return false;
  const int64_t nw = n / a.d * words;
  const auto p = [](const void* x) { return const_cast<uint4*>(static_cast<const uint4*>(x)); };
  qkv_copy16_kernel<kSplit><<<grid_for(nw, kThreads), kThreads, 0, s>>>(p(qkv), p(q), p(k), p(v), a, words, nw);
  MCPP_CUDA_LAUNCH_CHECK();
  return true;
}
}  // namespace

void launch_qkv_split(FOut q, FOut k, FOut v, FIn qkv, const QkvShape& a, cudaStream_t s) {
  const int64_t n = a.sb * (a.nq + 2 * a.ng) * a.d;
  if (n <= 0 || launch_copy16<true>(qkv.p, q.p, k.p, v.p, qkv.kind, q.kind, k.kind, v.kind, a, n, s)) return;
  qkv_split_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(q, k, v, qkv, a, n);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_qkv_merge(FOut qkv, FIn q, FIn k, FIn v, const QkvShape& a, cudaStream_t s) {
  const int64_t n = a.sb * (a.nq + 2 * a.ng) * a.d;
  if (n <= 0 || launch_copy16<false>(qkv.p, q.p, k.p, v.p, qkv.kind, q.kind, k.kind, v.kind, a, n, s)) return;
  qkv_merge_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(qkv, q, k, v, a, n);
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
