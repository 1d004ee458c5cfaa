// Device code for vocab_parallel_cross_entropy.cpp: one block per row, float32 math, online
// (max, sum-of-exp) per thread merged over the block (as cross_entropy_fwd in softmax_kernels.cu).
#include <algorithm>

#include "mcpp/kernels/cuda/device_utils.cuh"

namespace mcpp::cuda_detail {
namespace {

__global__ void partials_kernel(float* row_max, float* sum_exp, float* target_logit, FIn x, const int32_t* targets,
                                int64_t v, int64_t vocab_start) {
  __shared__ float sm[32], ss[32];
  const int64_t r = blockIdx.x, base = r * v;
  float m = -INFINITY, s = 0.0f;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) online_merge(m, s, x[base + j], 1.0f);
  block_online_merge(m, s, sm, ss);
  if (threadIdx.x == 0) {
    row_max[r] = m;
    sum_exp[r] = s;
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

__global__ void combine_kernel(int step, float* out, const float* a, const float* b, const float* c, float* out2,
                               int64_t n) {
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < n;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (step == 0) {
      out[r] = a[r] + logf(b[r]);
    } else if (step == 1) {
      out[r] = expf(a[r] - b[r]);
    } else {
      const float l = a[r] + logf(b[r]);
      out2[r] = l;
      out[r] = l - c[r];
    }
  }
}
}  // namespace

void launch_vocab_parallel_ce_combine(int step, float* out, const float* a, const float* b, const float* c, float* out2,
                                      int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 4096));
  combine_kernel<<<blocks, 256, 0, s>>>(step, out, a, b, c, out2, n);
  MCPP_CUDA_LAUNCH_CHECK();
}

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
