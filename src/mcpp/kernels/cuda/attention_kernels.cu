// Device code for attention.cpp: FlashAttention-2-style forward and backward (Dao 2023) with GQA and the
// causal mask, any head dim d that is a multiple of 8 up to 256; memory O(tile) per block — no [s, s] buffer.
// The kernels are templated on the padded width D = d rounded up to a multiple of 32 (32, 64, ..., 256): each lane
// owns D / 32 columns, the tiles hold D columns with zeros past d (loaded as zeros, so they add nothing to a dot
// product), and columns >= d are never stored.
// Layouts: q/o/dq [s, b, nq, d], k/v/dk/dv [s, b, ng, d], lse/delta float32 [b, nq, s]; query head h reads
// kv group h / (nq / ng). Math float32 on CUDA cores: the path for float32 and mixed-dtype calls, and for bf16
// calls that neither cuDNN nor the tensor-core kernels (d 64 / 128) take (attention.cpp).
//
// Forward (grid: b*nq heads x s/16 query tiles): 4 warps x 4 query rows. Per 32-key tile in shared memory,
// lane j scores key j against a row (Q broadcast, K rows padded to D+1 floats: conflict-free), the warp
// updates the online softmax (running max m, sum l) and each lane accumulates D/32 output columns with
// the probabilities broadcast by shuffles. lse = m + log(l) of the scaled scores.
// Backward: delta = rowsum(dO * O) (one warp per row); then two passes that own their outputs (no
// atomics, deterministic): dK/dV (grid: b*ng x s/16 key tiles; each warp owns 4 keys, loops over the
// group's heads and 32-query tiles, lane = query) and dQ (like the forward, lane = key), both recomputing
// P = exp(scale q.k - lse) and dS = P (dO.v - delta); dK, dQ carry the softmax scale.
// Attention dropout (a.drop_p > 0, philox.cuh AttnDropout): with z the mask value of (query, key), the
// forward accumulates P z V (l sums the undropped P); the backward uses P z for dV and dS = P (z dO.v - delta).
#include <type_traits>

#include "mcpp/kernels/cuda/device_utils.cuh"
#include "mcpp/kernels/cuda/philox.cuh"

namespace mcpp::cuda_detail {
namespace {
constexpr int kWarps = 4, kRowsPerWarp = 4, kTile = kWarps * kRowsPerWarp /*16*/, kKeys = 32;

__device__ __forceinline__ int64_t q_index(const AttnShape& a, int64_t i, int64_t bb, int64_t h) {
  return ((i * a.b + bb) * a.nq + h) * a.d;
}
__device__ __forceinline__ int64_t kv_index(const AttnShape& a, int64_t j, int64_t bb, int64_t g) {
  return ((j * a.b + bb) * a.ng + g) * a.d;
}

// rows [r0, r0 + nrows) of one head into dst[nrows][D + pad] (zeros beyond s and in the columns d..D-1)
template <int D>
__device__ void load_rows(float* dst, int pad, FIn src, const AttnShape& a, int64_t r0, int nrows, int64_t bb,
                          int64_t head, bool kv) {
  for (int idx = threadIdx.x; idx < nrows * D; idx += blockDim.x) {
    const int r = idx / D, t = idx - r * D;
    const int64_t row = r0 + r;
    float val = 0.0f;
    if (row < a.s && t < a.d) val = src[(kv ? kv_index(a, row, bb, head) : q_index(a, row, bb, head)) + t];
    dst[r * (D + pad) + t] = val;
  }
}

// Document masking (AttnShape::doc): key kj lies in query qi's document (always true without documents).
__device__ __forceinline__ bool in_doc(const AttnShape& a, int64_t bb, int64_t qi, int64_t kj) {
  return a.doc == nullptr || kj >= a.doc[bb * a.s + qi];
}

template <int D>
__global__ void __launch_bounds__(128) attn_fwd_kernel(FOut o, float* lse, FIn q, FIn k, FIn v, AttnShape a) {
  constexpr int C = D / 32;
  extern __shared__ float smem[];
  float* Ks = smem;                  // [kKeys][D+1]
  float* Vs = Ks + kKeys * (D + 1);  // [kKeys][D]
  float* Qs = Vs + kKeys * D;        // [kTile][D]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t bb = blockIdx.x / a.nq, h = blockIdx.x % a.nq, g = h / (a.nq / a.ng);
  const int64_t q0 = static_cast<int64_t>(blockIdx.y) * kTile;
  load_rows<D>(Qs, 0, q, a, q0, kTile, bb, h, false);
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][C];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c) acc[r][c] = 0.0f;
  }
  const AttnDropout drop = a.drop_p > 0.0f ? AttnDropout::from(a) : AttnDropout{};
  const int64_t k_end = a.causal ? min(a.s, q0 + kTile) : a.s;
  for (int64_t k0 = 0; k0 < k_end; k0 += kKeys) {
    __syncthreads();
    load_rows<D>(Ks, 1, k, a, k0, kKeys, bb, g, true);
    load_rows<D>(Vs, 0, v, a, k0, kKeys, bb, g, true);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = warp * kRowsPerWarp + r;
      const int64_t qi = q0 + row, kj = k0 + lane;
      if (qi >= a.s) continue;  // warp-uniform
      const bool valid = kj < a.s && (!a.causal || kj <= qi) && in_doc(a, bb, qi, kj);
      float sc = -INFINITY;
      if (valid) {
        float dot = 0.0f;
#pragma unroll 16
        for (int t = 0; t < D; ++t) dot += Qs[row * D + t] * Ks[lane * (D + 1) + t];
        sc = dot * a.scale;
      }
      const float mn = fmaxf(m[r], warp_max(sc));
      if (mn == -INFINITY) continue;  // warp-uniform: no valid key yet
      const float p = valid ? __expf(sc - mn) : 0.0f;
      const float corr = __expf(m[r] - mn);
      l[r] = l[r] * corr + warp_sum(p);
      m[r] = mn;
      const float pz = a.drop_p > 0.0f && valid ? p * drop.keep(AttnDropout::index(a, bb, h, qi, kj)) : p;
#pragma unroll
      for (int c = 0; c < C; ++c) acc[r][c] *= corr;
      for (int jj = 0; jj < kKeys; ++jj) {
        const float pj = __shfl_sync(0xffffffffu, pz, jj);
#pragma unroll
        for (int c = 0; c < C; ++c) acc[r][c] += pj * Vs[jj * D + lane + 32 * c];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t qi = q0 + warp * kRowsPerWarp + r;
    if (qi >= a.s) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c)
      if (lane + 32 * c < a.d) o.set(q_index(a, qi, bb, h) + lane + 32 * c, acc[r][c] * inv);
    if (lane == 0) lse[(bb * a.nq + h) * a.s + qi] = m[r] + logf(l[r]);
  }
}

// delta[b, nq, s] = sum_t dout * o, one warp per (i, b, h) row of the [s, b, nq] order.
__global__ void attn_delta_kernel(float* delta, FIn dout, FIn o, AttnShape a) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= a.s * a.b * a.nq) return;
  float s = 0.0f;
  for (int64_t t = lane; t < a.d; t += 32) s += dout[row * a.d + t] * o[row * a.d + t];
  s = warp_sum(s);
  const int64_t i = row / (a.b * a.nq), bb = (row / a.nq) % a.b, h = row % a.nq;
  if (lane == 0) delta[(bb * a.nq + h) * a.s + i] = s;
}

template <int D>
__global__ void __launch_bounds__(128) attn_dq_kernel(FOut dq, FIn dout, FIn q, FIn k, FIn v, const float* lse,
                                                      const float* delta, AttnShape a) {
  constexpr int C = D / 32;
  extern __shared__ float smem[];
  float* Ks = smem;                   // [kKeys][D+1]
  float* Vs = Ks + kKeys * (D + 1);   // [kKeys][D+1]
  float* Qs = Vs + kKeys * (D + 1);   // [kTile][D]
  float* dOs = Qs + kTile * D;        // [kTile][D]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t bb = blockIdx.x / a.nq, h = blockIdx.x % a.nq, g = h / (a.nq / a.ng);
  const int64_t q0 = static_cast<int64_t>(blockIdx.y) * kTile;
  load_rows<D>(Qs, 0, q, a, q0, kTile, bb, h, false);
  load_rows<D>(dOs, 0, dout, a, q0, kTile, bb, h, false);
  float acc[kRowsPerWarp][C], lse_r[kRowsPerWarp], del_r[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t qi = q0 + warp * kRowsPerWarp + r;
    lse_r[r] = qi < a.s ? lse[(bb * a.nq + h) * a.s + qi] : 0.0f;
    del_r[r] = qi < a.s ? delta[(bb * a.nq + h) * a.s + qi] : 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c) acc[r][c] = 0.0f;
  }
  const AttnDropout drop = a.drop_p > 0.0f ? AttnDropout::from(a) : AttnDropout{};
  const int64_t k_end = a.causal ? min(a.s, q0 + kTile) : a.s;
  for (int64_t k0 = 0; k0 < k_end; k0 += kKeys) {
    __syncthreads();
    load_rows<D>(Ks, 1, k, a, k0, kKeys, bb, g, true);
    load_rows<D>(Vs, 1, v, a, k0, kKeys, bb, g, true);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = warp * kRowsPerWarp + r;
      const int64_t qi = q0 + row, kj = k0 + lane;
      if (qi >= a.s) continue;
      float ds = 0.0f;
      if (kj < a.s && (!a.causal || kj <= qi) && in_doc(a, bb, qi, kj)) {
        float sqk = 0.0f, sdv = 0.0f;
#pragma unroll 16
        for (int t = 0; t < D; ++t) {
          sqk += Qs[row * D + t] * Ks[lane * (D + 1) + t];
          sdv += dOs[row * D + t] * Vs[lane * (D + 1) + t];
        }
        const float p = __expf(sqk * a.scale - lse_r[r]);
        const float z = a.drop_p > 0.0f ? drop.keep(AttnDropout::index(a, bb, h, qi, kj)) : 1.0f;
        ds = p * (z * sdv - del_r[r]);
      }
      for (int jj = 0; jj < kKeys; ++jj) {
        const float dsj = __shfl_sync(0xffffffffu, ds, jj);
#pragma unroll
        for (int c = 0; c < C; ++c) acc[r][c] += dsj * Ks[jj * (D + 1) + lane + 32 * c];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t qi = q0 + warp * kRowsPerWarp + r;
    if (qi >= a.s) continue;
#pragma unroll
    for (int c = 0; c < C; ++c)
      if (lane + 32 * c < a.d) dq.set(q_index(a, qi, bb, h) + lane + 32 * c, acc[r][c] * a.scale);
  }
}

template <int D>
__global__ void __launch_bounds__(128) attn_dkdv_kernel(FOut dk, FOut dv, FIn dout, FIn q, FIn k, FIn v,
                                                        const float* lse, const float* delta, AttnShape a) {
  constexpr int C = D / 32;
  extern __shared__ float smem[];
  float* Kk = smem;                   // [kTile][D]  this block's keys
  float* Vk = Kk + kTile * D;         // [kTile][D]
  float* Qs = Vk + kTile * D;         // [kKeys][D+1] a 32-query tile (lane = query)
  float* dOs = Qs + kKeys * (D + 1);  // [kKeys][D+1]
  float* lse_s = dOs + kKeys * (D + 1);
  float* del_s = lse_s + kKeys;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t bb = blockIdx.x / a.ng, g = blockIdx.x % a.ng, group = a.nq / a.ng;
  const int64_t k0 = static_cast<int64_t>(blockIdx.y) * kTile;
  load_rows<D>(Kk, 0, k, a, k0, kTile, bb, g, true);
  load_rows<D>(Vk, 0, v, a, k0, kTile, bb, g, true);
  float ak[kRowsPerWarp][C], av[kRowsPerWarp][C];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int c = 0; c < C; ++c) ak[r][c] = av[r][c] = 0.0f;
  const AttnDropout drop = a.drop_p > 0.0f ? AttnDropout::from(a) : AttnDropout{};
  const int64_t q_begin = a.causal ? (k0 / kKeys) * kKeys : 0;
  for (int64_t hh = 0; hh < group; ++hh) {
    const int64_t h = g * group + hh;
    for (int64_t q0 = q_begin; q0 < a.s; q0 += kKeys) {
      __syncthreads();
      load_rows<D>(Qs, 1, q, a, q0, kKeys, bb, h, false);
      load_rows<D>(dOs, 1, dout, a, q0, kKeys, bb, h, false);
      if (threadIdx.x < kKeys) {
        const int64_t qi = q0 + threadIdx.x;
        lse_s[threadIdx.x] = qi < a.s ? lse[(bb * a.nq + h) * a.s + qi] : 0.0f;
        del_s[threadIdx.x] = qi < a.s ? delta[(bb * a.nq + h) * a.s + qi] : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const int kr = warp * kRowsPerWarp + r;
        const int64_t kj = k0 + kr, qi = q0 + lane;
        if (kj >= a.s) continue;  // warp-uniform
        float p = 0.0f, ds = 0.0f;
        if (qi < a.s && (!a.causal || kj <= qi) && in_doc(a, bb, qi, kj)) {
          float sqk = 0.0f, sdv = 0.0f;
#pragma unroll 16
          for (int t = 0; t < D; ++t) {
            sqk += Qs[lane * (D + 1) + t] * Kk[kr * D + t];
            sdv += dOs[lane * (D + 1) + t] * Vk[kr * D + t];
          }
          p = __expf(sqk * a.scale - lse_s[lane]);
          const float z = a.drop_p > 0.0f ? drop.keep(AttnDropout::index(a, bb, h, qi, kj)) : 1.0f;
          ds = p * (z * sdv - del_s[lane]);
          p *= z;
        }
        for (int ii = 0; ii < kKeys; ++ii) {
          const float pi = __shfl_sync(0xffffffffu, p, ii), dsi = __shfl_sync(0xffffffffu, ds, ii);
#pragma unroll
          for (int c = 0; c < C; ++c) {
            av[r][c] += pi * dOs[ii * (D + 1) + lane + 32 * c];
            ak[r][c] += dsi * Qs[ii * (D + 1) + lane + 32 * c];
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t kj = k0 + warp * kRowsPerWarp + r;
    if (kj >= a.s) continue;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      if (lane + 32 * c >= a.d) continue;
      dk.set(kv_index(a, kj, bb, g) + lane + 32 * c, ak[r][c] * a.scale);
      dv.set(kv_index(a, kj, bb, g) + lane + 32 * c, av[r][c]);
    }
  }
}

template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  MCPP_CUDA_CHECK_RT(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <int D>
void fwd(FOut o, float* lse, FIn q, FIn k, FIn v, const AttnShape& a, cudaStream_t s) {
  const size_t smem = sizeof(float) * (kKeys * (D + 1) + kKeys * D + kTile * D);
  allow_smem(attn_fwd_kernel<D>, smem);
  const dim3 grid(static_cast<unsigned>(a.b * a.nq), static_cast<unsigned>((a.s + kTile - 1) / kTile));
  attn_fwd_kernel<D><<<grid, 128, smem, s>>>(o, lse, q, k, v, a);
  MCPP_CUDA_LAUNCH_CHECK();
}

template <int D>
void bwd(FOut dq, FOut dk, FOut dv, FIn dout, FIn q, FIn k, FIn v, const float* lse, const float* delta,
         const AttnShape& a, cudaStream_t s) {
  const size_t smem_q = sizeof(float) * (2 * kKeys * (D + 1) + 2 * kTile * D);
  allow_smem(attn_dq_kernel<D>, smem_q);
  const dim3 grid_q(static_cast<unsigned>(a.b * a.nq), static_cast<unsigned>((a.s + kTile - 1) / kTile));
  attn_dq_kernel<D><<<grid_q, 128, smem_q, s>>>(dq, dout, q, k, v, lse, delta, a);
  MCPP_CUDA_LAUNCH_CHECK();
  const size_t smem_kv = sizeof(float) * (2 * kTile * D + 2 * kKeys * (D + 1) + 2 * kKeys);
  allow_smem(attn_dkdv_kernel<D>, smem_kv);
  const dim3 grid_kv(static_cast<unsigned>(a.b * a.ng), static_cast<unsigned>((a.s + kTile - 1) / kTile));
  attn_dkdv_kernel<D><<<grid_kv, 128, smem_kv, s>>>(dk, dv, dout, q, k, v, lse, delta, a);
  MCPP_CUDA_LAUNCH_CHECK();
}
}  // namespace

namespace {
__global__ void philox_args_kernel(int64_t* out, uint64_t seed, uint64_t offset, const uint64_t* base) {
  out[0] = static_cast<int64_t>(seed);
  out[1] = static_cast<int64_t>(offset + (base ? *base : 0));
}
}  // namespace

void launch_philox_args(int64_t* out, uint64_t seed, uint64_t offset, const uint64_t* base, cudaStream_t s) {
  philox_args_kernel<<<1, 1, 0, s>>>(out, seed, offset, base);
  MCPP_CUDA_LAUNCH_CHECK();
}

namespace {
// The instance for head dim d: D = d rounded up to a multiple of 32 (attention.cpp checks 0 < d <= 256).
template <typename F>
void with_padded_d(int64_t d, F&& f) {
  switch ((d + 31) / 32) {
    case 1: f(std::integral_constant<int, 32>{}); break;
    case 2: f(std::integral_constant<int, 64>{}); break;
    case 3: f(std::integral_constant<int, 96>{}); break;
    case 4: f(std::integral_constant<int, 128>{}); break;
    case 5: f(std::integral_constant<int, 160>{}); break;
    case 6: f(std::integral_constant<int, 192>{}); break;
    case 7: f(std::integral_constant<int, 224>{}); break;
    default: f(std::integral_constant<int, 256>{}); break;
  }
}
}  // namespace

void launch_attention_fwd(FOut o, float* lse, FIn q, FIn k, FIn v, const AttnShape& a, cudaStream_t s) {
  if (a.s <= 0 || a.b * a.nq <= 0) return;
  with_padded_d(a.d, [&](auto D) { fwd<decltype(D)::value>(o, lse, q, k, v, a, s); });
}

void launch_attention_bwd(FOut dq, FOut dk, FOut dv, FIn dout, FIn q, FIn k, FIn v, FIn o, const float* lse,
                          float* delta, const AttnShape& a, cudaStream_t s) {
  if (a.s <= 0 || a.b * a.nq <= 0) return;
  const int64_t rows = a.s * a.b * a.nq;
  attn_delta_kernel<<<static_cast<unsigned>((rows + 7) / 8), 256, 0, s>>>(delta, dout, o, a);
  MCPP_CUDA_LAUNCH_CHECK();
  with_padded_d(a.d, [&](auto D) { bwd<decltype(D)::value>(dq, dk, dv, dout, q, k, v, lse, delta, a, s); });
}

// ---- GQA around an MHA backward (cudnn_attention.cpp): k/v of ng groups repeated to nq heads, and the
// nq heads' dk/dv summed back per group. bf16, 16-byte vectors (d % 8 == 0, every address 16-byte aligned:
// the tensor-core path's precondition). Expanded tensors are contiguous [s, b, nq, d]; the grouped ones
// sit at the AttnShape kv layout fields.
namespace {
__global__ void gqa_expand_kernel(uint4* ke, uint4* ve, const uint4* k, const uint4* v, AttnShape a,
                                  int64_t total) {
  const int64_t dv = a.d / 8, r = a.nq / a.ng;
  MCPP_GRID_STRIDE(e, total) {  // e over [s, b, nq, d / 8]
    const int64_t c = e % dv, h = (e / dv) % a.nq, bb = (e / (dv * a.nq)) % a.b, i = e / (dv * a.nq * a.b);
    const int64_t src = (i * a.kv_row + bb * a.kv_batch + (h / r) * a.kv_group) / 8 + c;
    ke[e] = k[src];
    ve[e] = v[src];
  }
}

__global__ void gqa_reduce_kernel(uint4* dk, uint4* dv, const uint4* dke, const uint4* dve, AttnShape a,
                                  int64_t total) {
  const int64_t dvec = a.d / 8, r = a.nq / a.ng;
  MCPP_GRID_STRIDE(e, total) {  // e over [s, b, ng, d / 8]
    const int64_t c = e % dvec, g = (e / dvec) % a.ng, bb = (e / (dvec * a.ng)) % a.b, i = e / (dvec * a.ng * a.b);
    float sk[8] = {0, 0, 0, 0, 0, 0, 0, 0}, sv[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = 0; j < r; ++j) {  // the group's heads in order (deterministic)
      const int64_t src = ((i * a.b + bb) * a.nq + g * r + j) * dvec + c;
      float x[8], y[8];
      unpack8(dke[src], kBF16, x);
      unpack8(dve[src], kBF16, y);
#pragma unroll
      for (int t = 0; t < 8; ++t) sk[t] += x[t], sv[t] += y[t];
    }
    const int64_t dst = (i * a.kv_row + bb * a.kv_batch + g * a.kv_group) / 8 + c;
    store8(FOut{dk, kBF16}, dst, sk);
    store8(FOut{dv, kBF16}, dst, sv);
  }
}
}  // namespace

void launch_gqa_expand_kv(void* k_exp, void* v_exp, const void* k, const void* v, const AttnShape& a,
                          cudaStream_t s) {
  const int64_t total = a.s * a.b * a.nq * (a.d / 8);
  if (total <= 0) return;
  gqa_expand_kernel<<<grid_for(total, 256), 256, 0, s>>>(static_cast<uint4*>(k_exp), static_cast<uint4*>(v_exp),
                                                        static_cast<const uint4*>(k), static_cast<const uint4*>(v), a,
                                                        total);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_gqa_reduce_dkv(void* dk, void* dv, const void* dk_exp, const void* dv_exp, const AttnShape& a,
                           cudaStream_t s) {
  const int64_t total = a.s * a.b * a.ng * (a.d / 8);
  if (total <= 0) return;
  gqa_reduce_kernel<<<grid_for(total, 256), 256, 0, s>>>(static_cast<uint4*>(dk), static_cast<uint4*>(dv),
                                                        static_cast<const uint4*>(dk_exp),
                                                        static_cast<const uint4*>(dv_exp), a, total);
  MCPP_CUDA_LAUNCH_CHECK();
}

namespace {
// One thread per output element; each recomputes its row's two weights from the two lse values (cheap next to
// the d loads). A row with lse_acc -inf takes the block, one with lse_blk -inf keeps its own. lse_acc is written
// by a second kernel, once every element has read the old value.
__global__ void attention_merge_kernel(float* o_acc, float* lse_acc, FIn o_blk, const float* lse_blk, int64_t s,
                                       int64_t bnq, int64_t d, int64_t total) {
  MCPP_GRID_STRIDE(idx, total) {
    const int64_t row = idx / d;
    const int64_t li = (row % bnq) * s + row / bnq;
    const float l = lse_acc[li], lb = lse_blk[li];
    const float ob = o_blk[idx];
    float a, c, merged;
    if (lb == -INFINITY) {
      a = 1.0f, c = 0.0f, merged = l;
    } else if (l == -INFINITY) {
      a = 0.0f, c = 1.0f, merged = lb;
    } else {
      const float m = fmaxf(l, lb);
      merged = m + logf(expf(l - m) + expf(lb - m));
      a = expf(l - merged), c = expf(lb - merged);
    }
    o_acc[idx] = (a == 0.0f ? 0.0f : o_acc[idx] * a) + ob * c;
  }
}

__global__ void attention_merge_lse_kernel(float* lse_acc, const float* lse_blk, int64_t n) {
  MCPP_GRID_STRIDE(i, n) {
    const float l = lse_acc[i], lb = lse_blk[i];
    if (lb == -INFINITY) continue;
    if (l == -INFINITY) {
      lse_acc[i] = lb;
      continue;
    }
    const float m = fmaxf(l, lb);
    lse_acc[i] = m + logf(expf(l - m) + expf(lb - m));
  }
}
}  // namespace

void launch_attention_merge(float* o_acc, float* lse_acc, FIn o_blk, const float* lse_blk, int64_t s, int64_t bnq,
                            int64_t d, cudaStream_t st) {
  const int64_t total = s * bnq * d;
  if (total <= 0) return;
  attention_merge_kernel<<<grid_for(total, 256), 256, 0, st>>>(o_acc, lse_acc, o_blk, lse_blk, s, bnq, d, total);
  MCPP_CUDA_LAUNCH_CHECK();
  attention_merge_lse_kernel<<<grid_for(s * bnq, 256), 256, 0, st>>>(lse_acc, lse_blk, s * bnq);
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
