// Device code for softmax.cpp and cross_entropy.cpp: one block per row, float32 math.
//   softmax fwd: p = softmax(scale * x) over the valid keys (j <= i % sq when causal), exactly 0 beyond.
//   softmax bwd: ds = scale * p * (dp - sum(dp * p)).
//   cross entropy fwd: one pass over the row with a per-thread online (max, sum-of-exp) pair, merged
//        across the block; lse = max + log(sum); loss = lse - x[target]. No fp32 copy of the logits.
//        A target outside [0, V) gives loss = NaN (caught by the trainer's non-finite check; the CPU
//        backend throws instead, which would need a device->host sync here).
//   cross entropy bwd: dx = (exp(x - lse) - onehot(target)) * dloss; element by element, so dlogits may
//        alias logits.
//   cross entropy fwd + bwd fused (2-byte logits, vector path, V <= 56K): the row is staged in shared memory
//        between the two passes, so the logits are read once.
//   masked loss stats: ONE block of kStatsThreads; thread t sums elements t, t + kStatsThreads, ... in
//        float64, then a fixed shared-memory tree (deterministic, no atomics). masked loss grad: coef from
//        stats[1] in float64 exactly as the CPU computes it, then dloss = mask * coef elementwise.
//   Cross entropy vector path (V % 8 == 0 and 16-byte aligned pointers — GPT vocabularies padded to a
//   multiple of 128): 16-byte loads (and stores in bwd) of 8 elements, kUnroll of them in flight per
//   thread; fwd folds each 8-chunk's max into the running (max, sum) with one rescale. Otherwise the
//   scalar FIn / FOut loops below.
#include <algorithm>

#include "mcpp/kernels/cuda/cross_entropy_rows.cuh"
#include "mcpp/kernels/cuda/device_utils.cuh"

namespace mcpp::cuda_detail {
namespace {
constexpr int kThreads = 256;

__global__ void softmax_fwd_kernel(FOut p, FIn x, int64_t sq, int64_t sk, float scale, bool causal) {
  __shared__ float scratch[33];
  const int64_t r = blockIdx.x, base = r * sk;
  const int64_t valid = causal ? (r % sq) + 1 : sk;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) mx = fmaxf(mx, scale * x[base + j]);
  mx = block_max(mx, scratch);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) sum += __expf(scale * x[base + j] - mx);
  const float inv = 1.0f / block_sum(sum, scratch);
  for (int64_t j = threadIdx.x; j < sk; j += blockDim.x)
    p.set(base + j, j < valid ? __expf(scale * x[base + j] - mx) * inv : 0.0f);
}

__global__ void softmax_bwd_kernel(FOut ds, FIn dp, FIn p, int64_t sk, float scale) {
  __shared__ float scratch[33];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * sk;
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < sk; j += blockDim.x) dot += dp[base + j] * p[base + j];
  dot = block_sum(dot, scratch);
  for (int64_t j = threadIdx.x; j < sk; j += blockDim.x) {
    const float pj = p[base + j];
    ds.set(base + j, scale * pj * (dp[base + j] - dot));
  }
}

template <bool Vec>
__global__ void __launch_bounds__(Vec ? kCeThreads : kCeScalarThreads)
    cross_entropy_fwd_kernel(float* loss, float* lse, FIn x, const int32_t* targets, int64_t v) {
  __shared__ float sm[32], ss[32];
  const int64_t r = blockIdx.x;
  float m = -INFINITY, s = 0.0f;
  ce_row_max_sum<Vec>(x, r, v, m, s, sm, ss);
  if (threadIdx.x == 0) {
    const float l = m + logf(s);
    const int32_t t = targets[r];
    lse[r] = l;
    loss[r] = (t >= 0 && t < v) ? l - x[r * v + t] : NAN;
  }
}

template <bool Vec>
__global__ void __launch_bounds__(Vec ? kCeThreads : kCeScalarThreads)
    cross_entropy_bwd_kernel(FOut dx, const float* dloss, FIn x, const int32_t* targets, const float* lse,
                             int64_t v) {
  const int64_t r = blockIdx.x;
  ce_row_grad<Vec>(dx, x, r, v, lse[r], dloss[r], targets[r]);
}

// Forward + backward of one row per block (2-byte logits, V % 8 == 0, 16-byte aligned): pass 1 streams the
// row from memory into shared memory while folding the online (max, sum); pass 2 turns the shared copy
// into the gradient and writes it (dx may alias x: the row is read in full before any write). The
// logits are read from memory once instead of twice (cross_entropy_fwd + cross_entropy_bwd).
constexpr int kCeFusedThreads = 512, kCeFusedUnroll = 4;  // 2 blocks per SM (1024 threads: 2% slower)
constexpr int64_t kCeFusedMaxV = 56 * 1024;  // 112 KiB of shared memory per row: two blocks per SM

__global__ void __launch_bounds__(kCeFusedThreads) cross_entropy_fwd_bwd_kernel(float* loss, float* lse, FOut dx,
                                                                               const float* dloss, FIn x,
                                                                               const int32_t* targets, int64_t v) {
  extern __shared__ uint4 row[];  // [v / 8]
  __shared__ float sm[32], ss[32], lse_row;
  const int64_t r = blockIdx.x, vecs = v / 8, vbase = r * vecs;
  const uint4* src = static_cast<const uint4*>(x.p) + vbase;
  float m = -INFINITY, s = 0.0f;
  int64_t j = threadIdx.x;
  for (; j + (kCeFusedUnroll - 1) * kCeFusedThreads < vecs; j += kCeFusedUnroll * kCeFusedThreads) {
    uint4 w[kCeFusedUnroll];
#pragma unroll
    for (int u = 0; u < kCeFusedUnroll; ++u) w[u] = src[j + u * kCeFusedThreads];
#pragma unroll
    for (int u = 0; u < kCeFusedUnroll; ++u) {
      row[j + u * kCeFusedThreads] = w[u];
      float c[8];
      unpack8(w[u], x.kind, c);
      online_add8(m, s, c);
    }
  }
  for (; j < vecs; j += kCeFusedThreads) {
    const uint4 w = src[j];
    row[j] = w;
    float c[8];
    unpack8(w, x.kind, c);
    online_add8(m, s, c);
  }
  block_online_merge(m, s, sm, ss);  // synchronizes: the whole row is in shared memory after it
  const int64_t t = targets[r];
  if (threadIdx.x == 0) {
    const float l = m + logf(s);
    lse[r] = l;
    lse_row = l;
    float xt = NAN;
    if (t >= 0 && t < v) {
      float c[8];
      unpack8(row[t / 8], x.kind, c);
      xt = c[t % 8];
    }
    loss[r] = l - xt;
  }
  __syncthreads();
  const float l = lse_row, g = dloss[r];
  for (j = threadIdx.x; j < vecs; j += kCeFusedThreads) {
    float c[8];
    unpack8(row[j], x.kind, c);
#pragma unroll
    for (int e = 0; e < 8; ++e) c[e] = (__expf(c[e] - l) - (j * 8 + e == t ? 1.0f : 0.0f)) * g;
    store8(dx, vbase + j, c);
  }
}

constexpr int kStatsThreads = 1024;

__global__ void masked_loss_stats_kernel(float* stats, const float* loss, const float* mask, int64_t n) {
  __shared__ double sum_s[kStatsThreads], cnt_s[kStatsThreads];
  double sum = 0, cnt = 0;
  for (int64_t i = threadIdx.x; i < n; i += kStatsThreads) {
    sum += static_cast<double>(loss[i]) * mask[i];
    cnt += mask[i];
  }
  sum_s[threadIdx.x] = sum;
  cnt_s[threadIdx.x] = cnt;
  __syncthreads();
  for (int w = kStatsThreads / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) {
      sum_s[threadIdx.x] += sum_s[threadIdx.x + w];
      cnt_s[threadIdx.x] += cnt_s[threadIdx.x + w];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    stats[0] = static_cast<float>(sum_s[0]);
    stats[1] = static_cast<float>(cnt_s[0]);
  }
}

__global__ void masked_loss_grad_kernel(float* dloss, const float* mask, const float* stats, float grad_scale,
                                        bool per_token, int64_t n) {
  const double count = stats[1];
  const float coef = per_token ? grad_scale : count > 0 ? static_cast<float>(grad_scale / count) : 0.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dloss[i] = mask[i] * coef;
}
}  // namespace

void launch_softmax_fwd(FOut probs, FIn scores, int64_t rows, int64_t sq, int64_t sk, float scale, bool causal,
                        cudaStream_t s) {
  if (rows * sq <= 0 || sk <= 0) return;
  softmax_fwd_kernel<<<static_cast<unsigned>(rows * sq), kThreads, 0, s>>>(probs, scores, sq, sk, scale, causal);
  MCPP_CUDA_LAUNCH_CHECK();
}
void launch_softmax_bwd(FOut dscores, FIn dprobs, FIn probs, int64_t rows, int64_t sk, float scale, cudaStream_t s) {
  if (rows <= 0 || sk <= 0) return;
  softmax_bwd_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(dscores, dprobs, probs, sk, scale);
  MCPP_CUDA_LAUNCH_CHECK();
}
void launch_cross_entropy_fwd(float* loss, float* lse, FIn logits, const int32_t* targets, int64_t n, int64_t v,
                              cudaStream_t s) {
  if (n <= 0) return;
  if (vec8_ok(v, {logits.p}))
    cross_entropy_fwd_kernel<true><<<static_cast<unsigned>(n), kCeThreads, 0, s>>>(loss, lse, logits, targets, v);
  else
    cross_entropy_fwd_kernel<false><<<static_cast<unsigned>(n), kCeScalarThreads, 0, s>>>(loss, lse, logits, targets,
                                                                                          v);
  MCPP_CUDA_LAUNCH_CHECK();
}
void launch_cross_entropy_bwd(FOut dlogits, const float* dloss, FIn logits, const int32_t* targets, const float* lse,
                              int64_t n, int64_t v, cudaStream_t s) {
  if (n <= 0) return;
  if (vec8_ok(v, {logits.p, dlogits.p}))
    cross_entropy_bwd_kernel<true><<<static_cast<unsigned>(n), kCeThreads, 0, s>>>(dlogits, dloss, logits, targets,
                                                                                   lse, v);
  else
    cross_entropy_bwd_kernel<false><<<static_cast<unsigned>(n), kCeScalarThreads, 0, s>>>(dlogits, dloss, logits,
                                                                                          targets, lse, v);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_masked_loss_stats(float* stats, const float* loss, const float* mask, int64_t n, cudaStream_t s) {
  masked_loss_stats_kernel<<<1, kStatsThreads, 0, s>>>(stats, loss, mask, n);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_masked_loss_grad(float* dloss, const float* mask, const float* stats, float grad_scale, bool per_token,
                             int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 1024));
  masked_loss_grad_kernel<<<blocks, 256, 0, s>>>(dloss, mask, stats, grad_scale, per_token, n);
  MCPP_CUDA_LAUNCH_CHECK();
}

bool launch_cross_entropy_fwd_bwd(float* loss, float* lse, FOut dlogits, const float* dloss, FIn logits,
                                  const int32_t* targets, int64_t n, int64_t v, cudaStream_t s) {
  if (logits.kind == kF32 || dlogits.kind != logits.kind || v > kCeFusedMaxV || !vec8_ok(v, {logits.p, dlogits.p}))
    return false;
  if (n <= 0) return true;
  const size_t smem = static_cast<size_t>(v) * 2;
  static const cudaError_t attr = cudaFuncSetAttribute(cross_entropy_fwd_bwd_kernel,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       static_cast<int>(kCeFusedMaxV * 2));
  if (attr != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  cross_entropy_fwd_bwd_kernel<<<static_cast<unsigned>(n), kCeFusedThreads, smem, s>>>(loss, lse, dlogits, dloss,
                                                                                       logits, targets, v);
  MCPP_CUDA_LAUNCH_CHECK();
  return true;
}

}  // namespace mcpp::cuda_detail
