// Device code for qkv.cpp: one thread per element of the fused QKV tensor, which it reads (split) or
// writes (merge) at its place in q / k / v. Coalesced on the qkv side and along d on the head side.
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

void launch_qkv_split(FOut q, FOut k, FOut v, FIn qkv, const QkvShape& a, cudaStream_t s) {
  const int64_t n = a.sb * (a.nq + 2 * a.ng) * a.d;
  if (n <= 0) return;
  qkv_split_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(q, k, v, qkv, a, n);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_qkv_merge(FOut qkv, FIn q, FIn k, FIn v, const QkvShape& a, cudaStream_t s) {
  const int64_t n = a.sb * (a.nq + 2 * a.ng) * a.d;
  if (n <= 0) return;
  qkv_merge_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(qkv, q, k, v, a, n);
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
