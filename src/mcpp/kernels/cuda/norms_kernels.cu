// Device code for norms.cpp (LayerNorm when mean != nullptr, RMSNorm otherwise), float32 math.
// Two paths, chosen per call by the launchers:
//   vector path (h % 8 == 0 and every pointer 16-byte aligned — the model's case): a row is held by a
//     group of W warps (W = ceil(h / 1024), so each thread owns V <= 4 chunks of 8 elements, j = tid +
//     k * 32W), R = 8 / W rows per 256-thread block, 16-byte loads/stores (load8 / store8).
//     fwd: x kept in registers; two-pass statistics (mean, then sum (x - mean)^2, no E[x^2] - mean^2
//          cancellation); rstd = rsqrt(var + eps) (biased var) or rsqrt(mean(x^2) + eps).
//     bwd: a persistent grid of G blocks strides over rows: dx = rstd (g - mean_h(g) [LN only] - xhat
//          mean_h(g xhat)), g = dy gamma, and each thread accumulates dy xhat (and dy) for its own
//          columns in registers; the block's R row groups are summed through shared memory in a fixed
//          order into partial[G, h] (fp32 scratch); norm_param_reduce adds the G partials per column in a
//          fixed order into dgamma (dbeta). Deterministic run to run (for a given G = SMs x occupancy).
//   scalar path (any h, any alignment): one block per row with FIn / FOut element access for fwd and the
//     dx part of bwd; the dgamma/dbeta partial sums of 256-row chunks are atomicAdd'ed (last-bit
//     run-to-run differences).
#include "mcpp/kernels/cuda/device_utils.cuh"

namespace mcpp::cuda_detail {
namespace {
constexpr int kRows = 256;
constexpr int kVecThreads = 256;  // per block on the vector path: 32W threads x R rows

int threads_for(int64_t h) { return h >= 1024 ? 512 : h >= 256 ? 256 : 128; }

// ---- scalar path ----------------------------------------------------------------------------------
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

// ---- vector path ----------------------------------------------------------------------------------
// Sum over the 32W threads of one row group (threadIdx.x); W uniform in the block. s: [R][8] shared.
__device__ __forceinline__ float row_sum(float v, int w, float (*s)[8]) {
  v = warp_sum(v);
  if (w == 1) return v;
  __syncthreads();  // previous use of s done
  if ((threadIdx.x & 31) == 0) s[threadIdx.y][threadIdx.x >> 5] = v;
  __syncthreads();
  float r = 0.0f;
  for (int i = 0; i < w; ++i) r += s[threadIdx.y][i];
  return r;
}

template <int V>
__global__ void __launch_bounds__(kVecThreads) norm_fwd_vec_kernel(FOut y, float* mean_out, float* rstd_out, FIn x,
                                                                   FIn gamma, FIn beta, int64_t n, int64_t h,
                                                                   float eps) {
  __shared__ float red[8][8];
  const int w = blockDim.x >> 5;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool valid = row < n;
  const int64_t vecs = h / 8, base = row * vecs;
  float v[V][8];
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (valid && j < vecs) {
      load8(x, base + j, v[k]);
#pragma unroll
      for (int e = 0; e < 8; ++e) s += v[k][e];
    }
  }
  const float inv_h = 1.0f / static_cast<float>(h);
  float mu = 0.0f;
  if (mean_out) mu = row_sum(s, w, red) * inv_h;
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (valid && j < vecs)
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float d = v[k][e] - mu;
        ss += d * d;
      }
  }
  const float rs = rsqrtf(row_sum(ss, w, red) * inv_h + eps);
  if (!valid) return;
  if (threadIdx.x == 0) {
    if (mean_out) mean_out[row] = mu;
    rstd_out[row] = rs;
  }
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (j < vecs) {
      float g[8], b[8] = {0, 0, 0, 0, 0, 0, 0, 0}, o[8];
      load8(gamma, j, g);
      if (beta.p) load8(beta, j, b);
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = (v[k][e] - mu) * rs * g[e] + b[e];
      store8(y, base + j, o);
    }
  }
}

// partial_g/b: [gridDim.x, h] — this block's sums over the rows it visited.
template <int V>
__global__ void __launch_bounds__(kVecThreads) norm_bwd_vec_kernel(FOut dx, float* partial_g, float* partial_b,
                                                                   FIn dy, FIn x, FIn gamma, const float* mean,
                                                                   const float* rstd, int64_t n, int64_t h) {
  __shared__ float red[8][8];
  __shared__ float colsum[kVecThreads * 8];  // [R][32W][8]: the row groups' column partials
  const int w = blockDim.x >> 5;
  const int64_t vecs = h / 8;
  const float inv_h = 1.0f / static_cast<float>(h);
  float ag[V][8], ab[V][8];
#pragma unroll
  for (int k = 0; k < V; ++k)
#pragma unroll
    for (int e = 0; e < 8; ++e) ag[k][e] = ab[k][e] = 0.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.y;
  const int64_t rows_here = (n + stride - 1) / stride;  // uniform trip count: row_sum synchronizes
  for (int64_t it = 0; it < rows_here; ++it) {
    const int64_t row = it * stride + static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
    const bool valid = row < n;
    const float mu = (valid && mean) ? mean[row] : 0.0f, rs = valid ? rstd[row] : 0.0f;
    const int64_t base = row * vecs;
    float sg = 0.0f, sgx = 0.0f;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      if (valid && j < vecs) {
        float xv[8], dv[8], g[8];
        load8(x, base + j, xv);
        load8(dy, base + j, dv);
        load8(gamma, j, g);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float gg = dv[e] * g[e];
          sg += gg;
          sgx += gg * ((xv[e] - mu) * rs);
        }
      }
    }
    const float mean_g = mean ? row_sum(sg, w, red) * inv_h : 0.0f;
    const float mean_gx = row_sum(sgx, w, red) * inv_h;
    if (!valid) continue;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      if (j < vecs) {
        float xv[8], dv[8], g[8], o[8];
        load8(x, base + j, xv);  // second read: L1/L2 hit
        load8(dy, base + j, dv);
        load8(gamma, j, g);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float xhat = (xv[e] - mu) * rs;
          o[e] = rs * (dv[e] * g[e] - mean_g - xhat * mean_gx);
          ag[k][e] += dv[e] * xhat;
          ab[k][e] += dv[e];
        }
        store8(dx, base + j, o);
      }
    }
  }
  // fold the R row groups (fixed order) and write this block's partial row
  const int tpr = blockDim.x;  // threads per row group
  for (int which = 0; which < (partial_b ? 2 : 1); ++which) {
    float* out = (which == 0 ? partial_g : partial_b) + static_cast<int64_t>(blockIdx.x) * h;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      __syncthreads();
#pragma unroll
      for (int e = 0; e < 8; ++e)
        colsum[(threadIdx.y * tpr + threadIdx.x) * 8 + e] = which == 0 ? ag[k][e] : ab[k][e];
      __syncthreads();
      const int64_t j = threadIdx.x + static_cast<int64_t>(k) * tpr;
      if (threadIdx.y == 0 && j < vecs) {
        float o[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          float t = 0.0f;
          for (int r = 0; r < static_cast<int>(blockDim.y); ++r) t += colsum[(r * tpr + threadIdx.x) * 8 + e];
          o[e] = t;
        }
        store8(FOut{out, kF32}, j, o);
      }
    }
  }
}

// acc[c] += sum over p of partial[p, c]: thread (x, y) sums p = y, y + 16, ... in order, then the 16
// per-y sums are added in y order. blockIdx.y selects dgamma (0) or dbeta (1, partial + parts * h).
__global__ void norm_param_reduce_kernel(float* acc_g, float* acc_b, const float* partial, int64_t parts, int64_t h) {
  __shared__ float s[16][33];
  float* acc = blockIdx.y == 0 ? acc_g : acc_b;
  const float* part = partial + static_cast<int64_t>(blockIdx.y) * parts * h;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float a = 0.0f;
  if (col < h) {
#pragma unroll 4
    for (int64_t p = threadIdx.y; p < parts; p += 16) a += part[p * h + col];
  }
  s[threadIdx.y][threadIdx.x] = a;
  __syncthreads();
  if (threadIdx.y == 0 && col < h) {
    float t = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) t += s[i][threadIdx.x];
    acc[col] += t;
  }
}

struct VecShape {
  int w, v, r;  // warps per row, chunks per thread, rows per block
};
VecShape vec_shape(int64_t h) {
  const int64_t vecs = h / 8;
  int w = static_cast<int>((vecs + 127) / 128);
  if (w > 8) return {0, 0, 0};  // h > 8192: scalar path
  w = w <= 1 ? 1 : w <= 2 ? 2 : w <= 4 ? 4 : 8;
  const int v = static_cast<int>((vecs + 32 * w - 1) / (32 * w));
  return {w, v, 8 / w};
}

template <int V>
int bwd_blocks_per_sm() {
  int b = 0;
  MCPP_CUDA_CHECK_RT(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, norm_bwd_vec_kernel<V>, kVecThreads, 0));
  return b < 1 ? 1 : b;
}

int sm_count() {
  static const int sms = [] {
    int dev = 0, n = 0;
    MCPP_CUDA_CHECK_RT(cudaGetDevice(&dev));
    MCPP_CUDA_CHECK_RT(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  }();
  return sms;
}
}  // namespace

int64_t norm_bwd_partial_blocks(int64_t n, int64_t h) {
  const VecShape vs = vec_shape(h);
  if (h % 8 != 0 || vs.w == 0 || n <= 0) return 0;
  static const int occ[5] = {0, bwd_blocks_per_sm<1>(), bwd_blocks_per_sm<2>(), bwd_blocks_per_sm<3>(),
                             bwd_blocks_per_sm<4>()};
  const int64_t want = (n + vs.r - 1) / vs.r, cap = static_cast<int64_t>(sm_count()) * occ[vs.v];
  return want < cap ? want : cap;
}

void launch_norm_fwd(FOut y, float* mean, float* rstd, FIn x, FIn gamma, FIn beta, int64_t n, int64_t h, float eps,
                     cudaStream_t s) {
  if (n <= 0) return;
  const VecShape vs = vec_shape(h);
  if (vs.w > 0 && vec8_ok(h, {y.p, x.p, gamma.p, beta.p})) {
    const dim3 block(32 * vs.w, vs.r);
    const unsigned grid = static_cast<unsigned>((n + vs.r - 1) / vs.r);
    switch (vs.v) {
      case 1: norm_fwd_vec_kernel<1><<<grid, block, 0, s>>>(y, mean, rstd, x, gamma, beta, n, h, eps); break;
      case 2: norm_fwd_vec_kernel<2><<<grid, block, 0, s>>>(y, mean, rstd, x, gamma, beta, n, h, eps); break;
      case 3: norm_fwd_vec_kernel<3><<<grid, block, 0, s>>>(y, mean, rstd, x, gamma, beta, n, h, eps); break;
      default: norm_fwd_vec_kernel<4><<<grid, block, 0, s>>>(y, mean, rstd, x, gamma, beta, n, h, eps); break;
    }
  } else {
    norm_fwd_kernel<<<static_cast<unsigned>(n), threads_for(h), 0, s>>>(y, mean, rstd, x, gamma, beta, h, eps);
  }
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_norm_bwd(FOut dx, float* dgamma, float* dbeta, FIn dy, FIn x, FIn gamma, const float* mean,
                     const float* rstd, int64_t n, int64_t h, float* partial, int64_t parts, cudaStream_t s) {
  if (n <= 0) return;
  const VecShape vs = vec_shape(h);
  if (parts > 0 && parts == norm_bwd_partial_blocks(n, h) && vec8_ok(h, {dx.p, dy.p, x.p, gamma.p, partial})) {
    const dim3 block(32 * vs.w, vs.r);
    const unsigned grid = static_cast<unsigned>(parts);
    float* pb = dbeta ? partial + parts * h : nullptr;
    switch (vs.v) {
      case 1: norm_bwd_vec_kernel<1><<<grid, block, 0, s>>>(dx, partial, pb, dy, x, gamma, mean, rstd, n, h); break;
      case 2: norm_bwd_vec_kernel<2><<<grid, block, 0, s>>>(dx, partial, pb, dy, x, gamma, mean, rstd, n, h); break;
      case 3: norm_bwd_vec_kernel<3><<<grid, block, 0, s>>>(dx, partial, pb, dy, x, gamma, mean, rstd, n, h); break;
      default: norm_bwd_vec_kernel<4><<<grid, block, 0, s>>>(dx, partial, pb, dy, x, gamma, mean, rstd, n, h); break;
    }
    MCPP_CUDA_LAUNCH_CHECK();
    const dim3 rgrid(static_cast<unsigned>((h + 31) / 32), dbeta ? 2u : 1u);
    norm_param_reduce_kernel<<<rgrid, dim3(32, 16), 0, s>>>(dgamma, dbeta, partial, parts, h);
    MCPP_CUDA_LAUNCH_CHECK();
    return;
  }
  norm_bwd_input_kernel<<<static_cast<unsigned>(n), threads_for(h), 0, s>>>(dx, dy, x, gamma, mean, rstd, h);
  MCPP_CUDA_LAUNCH_CHECK();
  const dim3 grid(static_cast<unsigned>((h + 31) / 32), static_cast<unsigned>((n + kRows - 1) / kRows));
  norm_bwd_param_kernel<<<grid, dim3(32, 8), 0, s>>>(dgamma, dbeta, dy, x, mean, rstd, n, h);
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
