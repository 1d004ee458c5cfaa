// Device code for mla.cpp (ops.inc mla_qkv_fwd / mla_qkv_bwd): one thread per output element, float32 math, the
// rotary channels in Megatron's MLA order (evens then odds, then rotate_half). The backward's shared-key gradient
// dk_pe: one thread per (token, rotary pair), summing the heads in order (deterministic).
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

__global__ void mla_qkv_fwd_kernel(FOut query, FOut key, FOut value, FIn q, FIn kv, FIn lat, const float* cos,
                                   const float* sin, int64_t b, MlaShape m, int64_t n_out) {
  const int64_t half = m.dr / 2, dq = m.dn + m.dr, dkv = m.dn + m.dv;
  MCPP_GRID_STRIDE(i, 3 * n_out) {
    const int64_t which = i / n_out, e = i - which * n_out;  // 0 query, 1 key, 2 value
    const int64_t j = e % m.dc, h = e / m.dc, t = h / m.n;
    const float* c = cos + (t / b) * half;
    const float* sn = sin + (t / b) * half;
    float v = 0.0f;
    if (which == 0) {
      if (j < m.dn) v = q[h * dq + j];
      else if (j < dq) v = mla_rope_at(q, h * dq + m.dn, j - m.dn, half, c, sn);
      query.set(e, v);
    } else if (which == 1) {
      if (j < m.dn) v = kv[h * dkv + j];
      else if (j < dq) v = mla_rope_at(lat, t * m.c + m.c - m.dr, j - m.dn, half, c, sn);
      key.set(e, v);
    } else {
      if (j < m.dv) v = kv[h * dkv + m.dn + j];
      value.set(e, v);
    }
  }
}

// dq / dkv elements (one thread each), then the shared key part in a second grid range.
__global__ void mla_qkv_bwd_kernel(FOut dq, FOut dkv, FOut dpe, FIn gq, FIn gk, FIn gv, const float* cos,
                                   const float* sin, int64_t b, MlaShape m, int64_t n_q, int64_t n_kv) {
  const int64_t half = m.dr / 2, dqw = m.dn + m.dr, dkvw = m.dn + m.dv, n_pe = m.sb * half;
  MCPP_GRID_STRIDE(i, n_q + n_kv + n_pe) {
    if (i < n_q) {
      const int64_t j = i % dqw, h = i / dqw, t = h / m.n;
      if (j < m.dn) {
        dq.set(i, gq[h * m.dc + j]);
      } else {  // the transpose rotation: dx[2k] = a cos + b sin, dx[2k+1] = b cos - a sin
        const int64_t r = j - m.dn, k = r / 2, base = h * m.dc + m.dn;
        const float c = cos[(t / b) * half + k], sn = sin[(t / b) * half + k];
        const float a = gq[base + k], bb = gq[base + k + half];
        dq.set(i, (r % 2 == 0) ? a * c + bb * sn : bb * c - a * sn);
      }
    } else if (i < n_q + n_kv) {
      const int64_t e = i - n_q, j = e % dkvw, h = e / dkvw;
      dkv.set(e, j < m.dn ? gk[h * m.dc + j] : gv[h * m.dc + (j - m.dn)]);
    } else {
      const int64_t e = i - n_q - n_kv, k = e % half, t = e / half;
      float a = 0.0f, bb = 0.0f;  // the heads' sums of channels k and k + half of the key's rotary part
      for (int64_t hd = 0; hd < m.n; ++hd) {
        const int64_t base = (t * m.n + hd) * m.dc + m.dn;
        a += gk[base + k];
        bb += gk[base + k + half];
      }
      const float c = cos[(t / b) * half + k], sn = sin[(t / b) * half + k];
      dpe.set(t * m.dr + 2 * k, a * c + bb * sn);
      dpe.set(t * m.dr + 2 * k + 1, bb * c - a * sn);
    }
  }
}
}  // namespace

void launch_mla_qkv_fwd(FOut query, FOut key, FOut value, FIn q, FIn kv, FIn kv_latent, const float* cos,
                        const float* sin, int64_t b, const MlaShape& m, cudaStream_t s) {
  const int64_t n_out = m.sb * m.n * m.dc;
  if (n_out <= 0) return;
  mla_qkv_fwd_kernel<<<grid_for(3 * n_out, kThreads), kThreads, 0, s>>>(query, key, value, q, kv, kv_latent, cos, sin,
                                                                         b, m, n_out);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_mla_qkv_bwd(FOut dq, FOut dkv, FOut dk_pe, FIn dquery, FIn dkey, FIn dvalue, const float* cos,
                        const float* sin, int64_t b, const MlaShape& m, cudaStream_t s) {
  const int64_t n_q = m.sb * m.n * (m.dn + m.dr), n_kv = m.sb * m.n * (m.dn + m.dv), n_pe = m.sb * (m.dr / 2);
  if (n_q + n_kv + n_pe <= 0) return;
  mla_qkv_bwd_kernel<<<grid_for(n_q + n_kv + n_pe, kThreads), kThreads, 0, s>>>(dq, dkv, dk_pe, dquery, dkey, dvalue,
                                                                                 cos, sin, b, m, n_q, n_kv);
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
