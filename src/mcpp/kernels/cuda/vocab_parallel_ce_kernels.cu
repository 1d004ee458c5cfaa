// Device code for vocab_parallel_cross_entropy.cpp: one block per row, float32 math, online
// (max, sum-of-exp) per thread merged over the block (as cross_entropy_fwd in softmax_kernels.cu).
#include "mcpp/kernels/cuda/device_utils.cuh"

namespace mcpp::cuda_detail {
namespace {
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  if (mn == -INFINITY) return;
  s = s * __expf(m - mn) + s2 * __expf(m2 - mn);
  m = mn;
}

__global__ void partials_kernel(float* row_max, float* sum_exp, float* target_logit, FIn x, const int32_t* targets,
                                int64_t v, int64_t vocab_start) {
  __shared__ float sm[32], ss[32];
  const int64_t r = blockIdx.x, base = r * v;
  float m = -INFINITY, s = 0.0f;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) merge(m, s, x[base + j], 1.0f);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float M = -INFINITY, S = 0.0f;
    for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) merge(M, S, sm[w], ss[w]);
    row_max[r] = M;
    sum_exp[r] = S;
    const int64_t local = static_cast<int64_t>(targets[r]) - vocab_start;
    target_logit[r] = (local >= 0 && local < v) ? x[base + local] : 0.0f;
  }
}

__global__ void bwd_kernel(FOut dx, const float* dloss, FIn x, const int32_t* targets, const float* lse, int64_t v,
                           int64_t vocab_start) {
  const int64_t r = blockIdx.x, base = r * v;
  const float l = lse[r], g = dloss[r];
  const int64_t t = static_cast<int64_t>(targets[r]) - vocab_start;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) dx.set(base + j, (__expf(x[base + j] - l) - (j == t ? 1.0f : 0.0f)) * g);
}
}  // namespace

void launch_vocab_parallel_ce_partials(float* row_max, float* sum_exp, float* target_logit, FIn logits,
                                       const int32_t* targets, int64_t n, int64_t v, int64_t vocab_start,
                                       cudaStream_t s) {
  if (n <= 0) return;
  partials_kernel<<<static_cast<unsigned>(n), 512, 0, s>>>(row_max, sum_exp, target_logit, logits, targets, v, vocab_start);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_vocab_parallel_ce_bwd(FOut dlogits, const float* dloss, FIn logits, const int32_t* targets,
                                  const float* lse, int64_t n, int64_t v, int64_t vocab_start, cudaStream_t s) {
  if (n <= 0) return;
  bwd_kernel<<<static_cast<unsigned>(n), 512, 0, s>>>(dlogits, dloss, logits, targets, lse, v, vocab_start);
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
