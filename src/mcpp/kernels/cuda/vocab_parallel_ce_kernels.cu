// Device code for vocab_parallel_cross_entropy.cpp: one block per row of the rank's [n, V/tp] logits, float32
// math, the row pieces of cross_entropy_rows.cuh (as cross_entropy_fwd / _bwd): 16-byte loads and stores
// when V/tp % 8 == 0 and the pointers are 16-byte aligned (GPT vocabularies padded to 128 * tp), else one
// element per step.
#include <algorithm>

#include "mcpp/kernels/cuda/cross_entropy_rows.cuh"
#include "mcpp/kernels/cuda/device_utils.cuh"

namespace mcpp::cuda_detail {
namespace {

template <bool Vec>
__global__ void __launch_bounds__(Vec ? kCeThreads : kCeScalarThreads)
    partials_kernel(float* row_max, float* sum_exp, float* target_logit, FIn x, const int32_t* targets, int64_t v,
                    int64_t vocab_start) {
  __shared__ float sm[32], ss[32];
  const int64_t r = blockIdx.x;
  float m = -INFINITY, s = 0.0f;
  ce_row_max_sum<Vec>(x, r, v, m, s, sm, ss);
  if (threadIdx.x == 0) {
    row_max[r] = m;
    sum_exp[r] = s;
    const int64_t local = static_cast<int64_t>(targets[r]) - vocab_start;
    target_logit[r] = (local >= 0 && local < v) ? x[r * v + local] : 0.0f;
  }
}

template <bool Vec>
__global__ void __launch_bounds__(Vec ? kCeThreads : kCeScalarThreads)
    bwd_kernel(FOut dx, const float* dloss, FIn x, const int32_t* targets, const float* lse, int64_t v,
               int64_t vocab_start) {
  const int64_t r = blockIdx.x;
  ce_row_grad<Vec>(dx, x, r, v, lse[r], dloss[r], static_cast<int64_t>(targets[r]) - vocab_start);
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
  if (vec8_ok(v, {logits.p}))
    partials_kernel<true><<<static_cast<unsigned>(n), kCeThreads, 0, s>>>(row_max, sum_exp, target_logit, logits,
                                                                          targets, v, vocab_start);
  else
    partials_kernel<false><<<static_cast<unsigned>(n), kCeScalarThreads, 0, s>>>(row_max, sum_exp, target_logit,
                                                                                 logits, targets, v, vocab_start);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_vocab_parallel_ce_bwd(FOut dlogits, const float* dloss, FIn logits, const int32_t* targets,
                                  const float* lse, int64_t n, int64_t v, int64_t vocab_start, cudaStream_t s) {
  if (n <= 0) return;
  if (vec8_ok(v, {logits.p, dlogits.p}))
    bwd_kernel<true><<<static_cast<unsigned>(n), kCeThreads, 0, s>>>(dlogits, dloss, logits, targets, lse, v,
                                                                     vocab_start);
  else
    bwd_kernel<false><<<static_cast<unsigned>(n), kCeScalarThreads, 0, s>>>(dlogits, dloss, logits, targets, lse, v,
                                                                            vocab_start);
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
