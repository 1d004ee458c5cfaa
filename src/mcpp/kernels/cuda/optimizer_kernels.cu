// Device code for optimizer.cpp.
//   adamw: elementwise, the operation order of kernels/cpu/adamw.cpp (torch.optim.AdamW) in float32 with
//          the scalar coefficients precomputed on the host in double; optional model copy written (f32/bf16).
//   sum_of_squares: deterministic two-stage reduction in float64: kReduceBlocks blocks each sum a fixed
//          grid-stride subset, then one block adds the partials in a fixed tree order.
//   has_non_finite: any element with all exponent bits set (NaN / inf) sets *flag = 1.
#include "mcpp/kernels/cuda/device_utils.cuh"

namespace mcpp::cuda_detail {
namespace {
constexpr int kThreads = 256;

__global__ void adamw_kernel(float* param, float* m, float* v, const float* grad, FOut model, AdamWCoeffs c,
                             int64_t n) {
  MCPP_GRID_STRIDE(i, n) {
    const float gi = grad[i];
    float pi = param[i] * c.decay;
    const float mi = m[i] * c.beta1 + gi * c.one_minus_b1;
    const float vi = v[i] * c.beta2 + gi * gi * c.one_minus_b2;
    const float denom = sqrtf(vi) / c.bc2_sqrt + c.eps;
    pi = pi - c.step_size * (mi / denom);
    param[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (model.p) model.set(i, pi);
  }
}

__global__ void sum_sq_partial_kernel(double* partial, FIn x, int64_t n) {
  __shared__ double scratch[33];
  double s = 0.0;
  MCPP_GRID_STRIDE(i, n) {
    const double v = x[i];
    s += v * v;
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_partials_kernel(double* result, const double* partial, int count) {
  __shared__ double scratch[33];
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) *result = s;
}

__global__ void non_finite_kernel(int* flag, FIn x, int64_t n) {
  MCPP_GRID_STRIDE(i, n) {
    if (!isfinite(x[i])) *flag = 1;
  }
}
}  // namespace

void launch_adamw(float* param, float* m, float* v, const float* grad, FOut model, const AdamWCoeffs& c, int64_t n,
                  cudaStream_t s) {
  if (n <= 0) return;
  adamw_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(param, m, v, grad, model, c, n);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_sum_of_squares(double* result, double* partial, FIn x, int64_t n, cudaStream_t s) {
  sum_sq_partial_kernel<<<kReduceBlocks, kThreads, 0, s>>>(partial, x, n);
  MCPP_CUDA_LAUNCH_CHECK();
  sum_partials_kernel<<<1, 1024, 0, s>>>(result, partial, kReduceBlocks);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_has_non_finite(int* flag, FIn x, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  non_finite_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(flag, x, n);
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
