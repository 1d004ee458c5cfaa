// Device code for mla.cpp (ops.inc mla_qkv_fwd / mla_qkv_bwd): one block per token, float32 math, the rotary channels
// in Megatron's MLA order (evens then odds, then rotate_half). The backward's shared-key gradient dk_pe: one thread
// per (token, rotary pair), summing the heads in order (deterministic).
#include "mcpp/kernels/cuda/device_utils.cuh"

namespace mcpp::cuda_detail {
namespace {
constexpr int kThreads = 256;

// Rotary output channel j < dr of the row x (dr channels, MLA order): see the header.
__device__ __forceinline__ float mla_rope_at(FIn x, int64_t base, int64_t j, int64_t half, const float* c,
                                             const float* sn) {
  if (j < half) return x[base + 2 * j] * c[j] - x[base + 2 * j + 1] * sn[j];
  const int64_t k = j - half;
  return x[base + 2 * k + 1] * c[k] + x[base + 2 * k] * sn[k];
}

// One block per token (grid-stride): its rotated shared key part once into shared memory, then every head's
// query / key / value channels (32-bit index math within the token; the int64 divisions of a flat element index
// cost more than the memory traffic).
__global__ void mla_qkv_fwd_kernel(FOut query, FOut key, FOut value, FIn q, FIn kv, FIn lat, const float* cos,
                                   const float* sin, int64_t b, MlaShape m) {
  extern __shared__ float k_pe[];  // [dr]
  const int n = static_cast<int>(m.n), dn = static_cast<int>(m.dn), dr = static_cast<int>(m.dr);
  const int dv = static_cast<int>(m.dv), dc = static_cast<int>(m.dc), half = dr / 2, dq = dn + dr, dkv = dn + dv;
  for (int64_t t = blockIdx.x; t < m.sb; t += gridDim.x) {
    const float* c = cos + (t / b) * half;
    const float* sn = sin + (t / b) * half;
    __syncthreads();  // the previous token's k_pe is read
    for (int j = threadIdx.x; j < dr; j += blockDim.x) k_pe[j] = mla_rope_at(lat, t * m.c + m.c - dr, j, half, c, sn);
    __syncthreads();
    for (int i = threadIdx.x; i < n * dc; i += blockDim.x) {
      const int h = i / dc, j = i - h * dc;
      const int64_t row = t * n + h, o = row * dc + j;
      float vq = 0.0f, vk = 0.0f, vv = 0.0f;
      if (j < dn) {
        vq = q[row * dq + j];
        vk = kv[row * dkv + j];
      } else if (j < dq) {
        vq = mla_rope_at(q, row * dq + dn, j - dn, half, c, sn);
        vk = k_pe[j - dn];
      }
      if (j < dv) vv = kv[row * dkv + dn + j];
      query.set(o, vq);
      key.set(o, vk);
      value.set(o, vv);
    }
  }
}

// One block per token: dq / dkv of every head, then the shared key part's gradient (one thread per rotary pair,
// the heads summed in order: deterministic).
__global__ void mla_qkv_bwd_kernel(FOut dq, FOut dkv, FOut dpe, FIn gq, FIn gk, FIn gv, const float* cos,
                                   const float* sin, int64_t b, MlaShape m) {
  const int n = static_cast<int>(m.n), dn = static_cast<int>(m.dn), dr = static_cast<int>(m.dr);
  const int dv = static_cast<int>(m.dv), dc = static_cast<int>(m.dc), half = dr / 2, dqw = dn + dr, dkvw = dn + dv;
  for (int64_t t = blockIdx.x; t < m.sb; t += gridDim.x) {
    const float* c = cos + (t / b) * half;
    const float* sn = sin + (t / b) * half;
    for (int i = threadIdx.x; i < n * dqw; i += blockDim.x) {
      const int h = i / dqw, j = i - h * dqw;
      const int64_t row = t * n + h, in = row * dc;
      if (j < dn) {
        dq.set(row * dqw + j, gq[in + j]);
      } else {  // the transpose rotation: dx[2k] = a cos + b sin, dx[2k+1] = b cos - a sin
        const int r = j - dn, k = r / 2;
        const float a = gq[in + dn + k], bb = gq[in + dn + k + half];
        dq.set(row * dqw + j, (r % 2 == 0) ? a * c[k] + bb * sn[k] : bb * c[k] - a * sn[k]);
      }
    }
    for (int i = threadIdx.x; i < n * dkvw; i += blockDim.x) {
      const int h = i / dkvw, j = i - h * dkvw;
      const int64_t row = t * n + h, in = row * dc;
      dkv.set(row * dkvw + j, j < dn ? gk[in + j] : gv[in + (j - dn)]);
    }
    for (int k = threadIdx.x; k < half; k += blockDim.x) {
      float a = 0.0f, bb = 0.0f;  // the heads' sums of channels k and k + half of the key's rotary part
      for (int h = 0; h < n; ++h) {
        const int64_t base = (t * n + h) * dc + dn;
        a += gk[base + k];
        bb += gk[base + k + half];
      }
      dpe.set(t * dr + 2 * k, a * c[k] + bb * sn[k]);
      dpe.set(t * dr + 2 * k + 1, bb * c[k] - a * sn[k]);
    }
  }
}
}  // namespace

static unsigned token_blocks(int64_t sb) { return static_cast<unsigned>(sb < 65535LL * 16 ? sb : 65535LL * 16); }

void launch_mla_qkv_fwd(FOut query, FOut key, FOut value, FIn q, FIn kv, FIn kv_latent, const float* cos,
                        const float* sin, int64_t b, const MlaShape& m, cudaStream_t s) {
  if (m.sb <= 0) return;
  const size_t shared = sizeof(float) * static_cast<size_t>(m.dr);
  mla_qkv_fwd_kernel<<<token_blocks(m.sb), kThreads, shared, s>>>(query, key, value, q, kv, kv_latent, cos, sin, b,
                                                                   m);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_mla_qkv_bwd(FOut dq, FOut dkv, FOut dk_pe, FIn dquery, FIn dkey, FIn dvalue, const float* cos,
                        const float* sin, int64_t b, const MlaShape& m, cudaStream_t s) {
  if (m.sb <= 0) return;
  mla_qkv_bwd_kernel<<<token_blocks(m.sb), kThreads, 0, s>>>(dq, dkv, dk_pe, dquery, dkey, dvalue, cos, sin, b, m);
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
