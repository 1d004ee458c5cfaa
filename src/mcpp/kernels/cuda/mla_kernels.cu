// Device code for mla.cpp (ops.inc mla_qkv_fwd / mla_qkv_bwd): one block per token, float32 math, the rotary channels
// in Megatron's MLA order (evens then odds, then rotate_half); 16-byte accesses where the head dims allow (vec8
// kernels), else one element a thread. The backward's shared-key gradient dk_pe sums the heads in order
// (deterministic).
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
// The 16-byte forms (all head dims multiples of 8, the rotary half too, 16-byte aligned buffers: the realistic
// shapes, e.g. DeepSeek's 128 + 64 / 128): each thread moves 8 channels of a head with load8 / store8.
__global__ void mla_qkv_fwd_vec8_kernel(FOut query, FOut key, FOut value, FIn q, FIn kv, FIn lat, const float* cos,
                                        const float* sin, int64_t b, MlaShape m) {
  extern __shared__ float k_pe[];  // [dr]
  const int n = static_cast<int>(m.n), dn = static_cast<int>(m.dn), dr = static_cast<int>(m.dr);
  const int dv = static_cast<int>(m.dv), dc = static_cast<int>(m.dc), half = dr / 2, dq = dn + dr, dkv = dn + dv;
  const int chunks = dc / 8;
  for (int64_t t = blockIdx.x; t < m.sb; t += gridDim.x) {
    const float* c = cos + (t / b) * half;
    const float* sn = sin + (t / b) * half;
    __syncthreads();  // the previous token's k_pe is read
    for (int j = threadIdx.x; j < dr; j += blockDim.x) k_pe[j] = mla_rope_at(lat, t * m.c + m.c - dr, j, half, c, sn);
    __syncthreads();
    for (int i = threadIdx.x; i < n * chunks; i += blockDim.x) {
      const int h = i / chunks, j0 = (i - h * chunks) * 8;
      const int64_t row = t * n + h, o = (row * dc + j0) / 8;
      float vq[8], vk[8], vv[8];
      if (j0 < dn) {
        load8(q, (row * dq + j0) / 8, vq);
        load8(kv, (row * dkv + j0) / 8, vk);
      } else if (j0 < dq) {
        const int jj = j0 - dn, k0 = jj < half ? jj : jj - half;
        float x[16];
        load8(q, (row * dq + dn + 2 * k0) / 8, *reinterpret_cast<float(*)[8]>(x));
        load8(q, (row * dq + dn + 2 * k0) / 8 + 1, *reinterpret_cast<float(*)[8]>(x + 8));
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const float x0 = x[2 * u], x1 = x[2 * u + 1], cc = c[k0 + u], ss = sn[k0 + u];
          vq[u] = jj < half ? x0 * cc - x1 * ss : x1 * cc + x0 * ss;
          vk[u] = k_pe[jj + u];
        }
      } else {
#pragma unroll
        for (int u = 0; u < 8; ++u) vq[u] = vk[u] = 0.0f;
      }
      if (j0 < dv) {
        load8(kv, (row * dkv + dn + j0) / 8, vv);
      } else {
#pragma unroll
        for (int u = 0; u < 8; ++u) vv[u] = 0.0f;
      }
      store8(query, o, vq);
      store8(key, o, vk);
      store8(value, o, vv);
    }
  }
}

__global__ void mla_qkv_bwd_vec8_kernel(FOut dq, FOut dkv, FOut dpe, FIn gq, FIn gk, FIn gv, const float* cos,
                                        const float* sin, int64_t b, MlaShape m) {
  const int n = static_cast<int>(m.n), dn = static_cast<int>(m.dn), dr = static_cast<int>(m.dr);
  const int dv = static_cast<int>(m.dv), dc = static_cast<int>(m.dc), half = dr / 2, dqw = dn + dr, dkvw = dn + dv;
  const int q_chunks = dqw / 8, kv_chunks = dkvw / 8, pe_chunks = half / 8;
  for (int64_t t = blockIdx.x; t < m.sb; t += gridDim.x) {
    const float* c = cos + (t / b) * half;
    const float* sn = sin + (t / b) * half;
    for (int i = threadIdx.x; i < n * q_chunks; i += blockDim.x) {
      const int h = i / q_chunks, j0 = (i - h * q_chunks) * 8;
      const int64_t row = t * n + h, in = row * dc;
      float v[8];
      if (j0 < dn) {
        load8(gq, (in + j0) / 8, v);
      } else {  // channels 2k, 2k+1 for k = k0 .. k0 + 3: the transpose rotation
        const int k0 = (j0 - dn) / 2;
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const float a = gq[in + dn + k0 + u], bb = gq[in + dn + k0 + u + half], cc = c[k0 + u], ss = sn[k0 + u];
          v[2 * u] = a * cc + bb * ss;
          v[2 * u + 1] = bb * cc - a * ss;
        }
      }
      store8(dq, (row * dqw + j0) / 8, v);
    }
    for (int i = threadIdx.x; i < n * kv_chunks; i += blockDim.x) {
      const int h = i / kv_chunks, j0 = (i - h * kv_chunks) * 8;
      const int64_t row = t * n + h, in = row * dc;
      float v[8];
      if (j0 < dn) load8(gk, (in + j0) / 8, v);
      else load8(gv, (in + j0 - dn) / 8, v);
      store8(dkv, (row * dkvw + j0) / 8, v);
    }
    for (int kc = threadIdx.x; kc < pe_chunks; kc += blockDim.x) {
      const int k0 = kc * 8;
      float a[8] = {}, bb[8] = {};  // the heads' sums of channels k0.. and k0 + half.. (heads in order)
      for (int h = 0; h < n; ++h) {
        const int64_t base = (t * n + h) * dc + dn;
        float x[8], y[8];
        load8(gk, (base + k0) / 8, x);
        load8(gk, (base + half + k0) / 8, y);
#pragma unroll
        for (int u = 0; u < 8; ++u) a[u] += x[u], bb[u] += y[u];
      }
      float out[16];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const float cc = c[k0 + u], ss = sn[k0 + u];
        out[2 * u] = a[u] * cc + bb[u] * ss;
        out[2 * u + 1] = bb[u] * cc - a[u] * ss;
      }
      store8(dpe, (t * dr + 2 * k0) / 8, *reinterpret_cast<float(*)[8]>(out));
      store8(dpe, (t * dr + 2 * k0) / 8 + 1, *reinterpret_cast<float(*)[8]>(out + 8));
    }
  }
}

bool mla_vec8(const MlaShape& m, std::initializer_list<const void*> ptrs) {
  return m.dn % 8 == 0 && m.dr % 16 == 0 && m.dv % 8 == 0 && m.dc % 8 == 0 && m.c % 8 == 0 && vec8_ok(8, ptrs);
}
}  // namespace

static unsigned token_blocks(int64_t sb) { return static_cast<unsigned>(sb < 65535LL * 16 ? sb : 65535LL * 16); }

void launch_mla_qkv_fwd(FOut query, FOut key, FOut value, FIn q, FIn kv, FIn kv_latent, const float* cos,
                        const float* sin, int64_t b, const MlaShape& m, cudaStream_t s) {
  if (m.sb <= 0) return;
  const size_t shared = sizeof(float) * static_cast<size_t>(m.dr);
  if (mla_vec8(m, {query.p, key.p, value.p, q.p, kv.p, kv_latent.p}) && query.kind == q.kind &&
      key.kind == q.kind && value.kind == q.kind && kv.kind == q.kind)
    mla_qkv_fwd_vec8_kernel<<<token_blocks(m.sb), kThreads, shared, s>>>(query, key, value, q, kv, kv_latent, cos,
                                                                          sin, b, m);
  else
    mla_qkv_fwd_kernel<<<token_blocks(m.sb), kThreads, shared, s>>>(query, key, value, q, kv, kv_latent, cos, sin, b,
                                                                     m);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_mla_qkv_bwd(FOut dq, FOut dkv, FOut dk_pe, FIn dquery, FIn dkey, FIn dvalue, const float* cos,
                        const float* sin, int64_t b, const MlaShape& m, cudaStream_t s) {
  if (m.sb <= 0) return;
  if (mla_vec8(m, {dq.p, dkv.p, dk_pe.p, dquery.p, dkey.p, dvalue.p}) && dkv.kind == dq.kind &&
      dk_pe.kind == dq.kind && dquery.kind == dq.kind && dkey.kind == dq.kind && dvalue.kind == dq.kind)
    mla_qkv_bwd_vec8_kernel<<<token_blocks(m.sb), kThreads, 0, s>>>(dq, dkv, dk_pe, dquery, dkey, dvalue, cos, sin, b,
                                                                     m);
  else
    mla_qkv_bwd_kernel<<<token_blocks(m.sb), kThreads, 0, s>>>(dq, dkv, dk_pe, dquery, dkey, dvalue, cos, sin, b, m);
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
