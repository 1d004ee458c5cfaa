// Device code for moe.cpp (mixture-of-experts row movement; contracts in kernels/ops.inc).
//   permute:       one block per token t; threads copy x[t] into out[idx[t, i]] for each of its k routes.
//   unpermute:     one block per token; each thread owns columns and sums its k routes in route order (fp32).
//   unpermute_bwd: one block per route (t, i); threads write din[idx[t, i]] = w * dy[t] and a block sum gives
//                  dw[t, i] = dy[t] . in[idx[t, i]] (fp32).
#include "mcpp/kernels/cuda/device_utils.cuh"

namespace mcpp::cuda_detail {
namespace {
constexpr int kThreads = 256;

__global__ void moe_permute_kernel(FOut out, FIn x, const int32_t* idx, int64_t k, int64_t h) {
  const int64_t t = blockIdx.x;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t j = idx[t * k + i];
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x) out.set(j * h + c, x[t * h + c]);
  }
}

__global__ void moe_unpermute_kernel(FOut y, FIn in, const int32_t* idx, const float* w, int64_t k, int64_t h) {
  const int64_t t = blockIdx.x;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    float acc = 0.0f;
    for (int64_t i = 0; i < k; ++i) {
      const float wi = w ? w[t * k + i] : 1.0f;
      acc += wi * in[static_cast<int64_t>(idx[t * k + i]) * h + c];
    }
    y.set(t * h + c, acc);
  }
}

__global__ void moe_unpermute_bwd_kernel(FOut din, float* dw, FIn dy, FIn in, const int32_t* idx, const float* w,
                                         int64_t k, int64_t h) {
  __shared__ float scratch[33];
  const int64_t route = blockIdx.x, t = route / k;
  const int64_t j = idx[route];
  const float wi = w[route];
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    const float g = dy[t * h + c];
    dot += g * in[j * h + c];
    din.set(j * h + c, wi * g);
  }
  dot = block_sum(dot, scratch);
  if (threadIdx.x == 0) dw[route] = dot;
}
}  // namespace

void launch_moe_permute(FOut out, FIn x, const int32_t* idx, int64_t n, int64_t k, int64_t h, cudaStream_t s) {
  if (n <= 0 || k <= 0 || h <= 0) return;
  moe_permute_kernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(out, x, idx, k, h);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_moe_unpermute(FOut y, FIn in, const int32_t* idx, const float* w, int64_t n, int64_t k, int64_t h,
                          cudaStream_t s) {
  if (n <= 0 || h <= 0) return;
  moe_unpermute_kernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(y, in, idx, w, k, h);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_moe_unpermute_bwd(FOut din, float* dw, FIn dy, FIn in, const int32_t* idx, const float* w, int64_t n,
                              int64_t k, int64_t h, cudaStream_t s) {
  if (n <= 0 || k <= 0) return;
  moe_unpermute_bwd_kernel<<<static_cast<unsigned>(n * k), kThreads, 0, s>>>(din, dw, dy, in, idx, w, k, h);
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
