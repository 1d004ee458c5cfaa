// Device code for norms.cpp (LayerNorm when mean != nullptr, RMSNorm otherwise), float32 math.
//   fwd: one block per row; two-pass statistics (mean, then sum (x - mean)^2) — no E[x^2] - mean^2
//        cancellation; rstd = rsqrt(var + eps) (biased var) or rsqrt(mean(x^2) + eps).
//   bwd input grad: one block per row: g = dy gamma, dx = rstd (g - mean_h(g) [LN only] - xhat mean_h(g xhat)).
//   bwd param grads: grid (h/32 column strips) x (row chunks of kRows), 32x8 threads; each block sums
//        dy xhat (and dy) for its strip over its chunk and atomicAdds one partial per column into dgamma
//        (dbeta): n / kRows atomics per column, chunk order unspecified (last-bit run-to-run differences).
#include "mcpp/kernels/cuda/device_utils.cuh"

namespace mcpp::cuda_detail {
namespace {
constexpr int kRows = 256;

int threads_for(int64_t h) { return h >= 1024 ? 512 : h >= 256 ? 256 : 128; }

__global__ void norm_fwd_kernel(FOut y, float* mean_out, float* rstd_out, FIn x, FIn gamma, FIn beta, int64_t h,
                                float eps) {
  __shared__ float scratch[33];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * h;
  float mu = 0.0f;
  if (mean_out) {
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x) s += x[base + c];
    mu = block_sum(s, scratch) / static_cast<float>(h);
  }
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    const float d = x[base + c] - mu;
    ss += d * d;
  }
  const float rs = rsqrtf(block_sum(ss, scratch) / static_cast<float>(h) + eps);
  if (threadIdx.x == 0) {
    if (mean_out) mean_out[blockIdx.x] = mu;
    rstd_out[blockIdx.x] = rs;
  }
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    float v = (x[base + c] - mu) * rs * gamma[c];
    if (beta.p) v += beta[c];
    y.set(base + c, v);
  }
}

__global__ void norm_bwd_input_kernel(FOut dx, FIn dy, FIn x, FIn gamma, const float* mean, const float* rstd,
                                      int64_t h) {
  __shared__ float scratch[33];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * h;
  const float mu = mean ? mean[blockIdx.x] : 0.0f, rs = rstd[blockIdx.x];
  float sg = 0.0f, sgx = 0.0f;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    const float g = dy[base + c] * gamma[c];
    sg += g;
    sgx += g * ((x[base + c] - mu) * rs);
  }
  const float inv_h = 1.0f / static_cast<float>(h);
  const float mean_g = mean ? block_sum(sg, scratch) * inv_h : 0.0f;
  const float mean_gx = block_sum(sgx, scratch) * inv_h;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    const float g = dy[base + c] * gamma[c];
    const float xhat = (x[base + c] - mu) * rs;
    dx.set(base + c, rs * (g - mean_g - xhat * mean_gx));
  }
}

__global__ void norm_bwd_param_kernel(float* dgamma, float* dbeta, FIn dy, FIn x, const float* mean,
                                      const float* rstd, int64_t n, int64_t h) {
  __shared__ float pg[8][33], pb[8][33];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRows, r1 = min(n, r0 + kRows);
  float ag = 0.0f, ab = 0.0f;
  if (col < h)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      const float d = dy[r * h + col];
      const float mu = mean ? mean[r] : 0.0f;
      ag += d * ((x[r * h + col] - mu) * rstd[r]);
      ab += d;
    }
  pg[threadIdx.y][threadIdx.x] = ag;
  pb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && col < h) {
    float sg = 0.0f, sb = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      sg += pg[i][threadIdx.x];
      sb += pb[i][threadIdx.x];
    }
    atomicAdd(dgamma + col, sg);
    if (dbeta) atomicAdd(dbeta + col, sb);
  }
}
}  // namespace

void launch_norm_fwd(FOut y, float* mean, float* rstd, FIn x, FIn gamma, FIn beta, int64_t n, int64_t h, float eps,
                     cudaStream_t s) {
  if (n <= 0) return;
  norm_fwd_kernel<<<static_cast<unsigned>(n), threads_for(h), 0, s>>>(y, mean, rstd, x, gamma, beta, h, eps);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_norm_bwd(FOut dx, float* dgamma, float* dbeta, FIn dy, FIn x, FIn gamma, const float* mean,
                     const float* rstd, int64_t n, int64_t h, cudaStream_t s) {
  if (n <= 0) return;
  norm_bwd_input_kernel<<<static_cast<unsigned>(n), threads_for(h), 0, s>>>(dx, dy, x, gamma, mean, rstd, h);
  MCPP_CUDA_LAUNCH_CHECK();
  const dim3 grid(static_cast<unsigned>((h + 31) / 32), static_cast<unsigned>((n + kRows - 1) / kRows));
  norm_bwd_param_kernel<<<grid, dim3(32, 8), 0, s>>>(dgamma, dbeta, dy, x, mean, rstd, n, h);
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
