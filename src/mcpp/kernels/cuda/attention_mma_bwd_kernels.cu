// bf16 tensor-core flash attention backward (FlashAttention-2 recomputation, Dao 2023) for attention.cpp:
// q/dq [s, b, nq, D], k/v/dk/dv [s, b, ng, D] (or views of the packed qkv / dqkv: AttnShape's layout
// fields), o/dout [s, b, nq, D], all bf16 and 16-byte aligned, lse float32
// [b, nq, s] from the forward, delta float32 scratch [b, nq, s]; D in {64, 128}; causal or full; GQA.
//
// Three launches, each block owning its outputs (no atomics: deterministic, bit-identical run to run):
//   1. delta = rowsum(dout * o) in fp32 (16-byte loads, one row per D/8 lanes).
//   2. dK/dV: grid x = b * ng, y = 128-key tiles (the causal-heaviest first). 8 warps x 16 keys; K and V
//      stay in shared memory, the block loops over the group's heads x query tiles (Q, dO, lse, delta
//      double-buffered by cp.async): S^T = K Q^T and dP^T = V dO^T by mma.m16n8k16, P^T = exp2(S^T scale
//      log2e - lse log2e) (masked: query >= s, key > query), dS^T = P^T (dP^T - delta); dV += P^T dO and
//      dK += dS^T Q with P^T, dS^T rounded to bf16 (as FA2); dK carries the scale. Summing over the group's
//      heads inside the block makes GQA free of reductions.
//   3. dQ: grid x = b * nq, y = 128-query tiles, like the forward (4 warps x 32 queries): S = Q K^T,
//      dP = dO V^T, dS as above, dQ += dS K, times scale.
// This recomputes S and dP once more than FA2's single pass with fp32 atomics into a dQ accumulator
// (7 matmuls of the forward's size instead of 5) in exchange for determinism and no fp32 dQ scratch.
// Warps whose tile is entirely masked by causality skip it; the mask is evaluated only on boundary tiles.
// DROP (attention dropout, philox.cuh AttnDropout; separate instantiations): with z the mask value of each
// (query, key), dV uses P z and dS = P (z dP - delta) — delta = rowsum(dO O) of the dropped output.
#include "mcpp/kernels/cuda/attention_mma.cuh"
#include "mcpp/kernels/cuda/launch.h"
#include "mcpp/kernels/cuda/philox.cuh"

namespace mcpp::cuda_detail {
namespace {
using namespace mma;

// dK/dV: 8 warps x 16 keys a block (4 warps x 16 measured the same, within 1%); dQ: 4 warps x 2 row tiles
// of 16 queries = 128 queries a block (each K/V fragment a warp loads feeds two products).
constexpr int kKVWarps = 8, kKVThreads = kKVWarps * 32, kKVRows = kKVWarps * 16;
constexpr int kQWarps = 4, kQThreads = kQWarps * 32, kQMT = 2, kQWarpRows = 16 * kQMT, kQRows = kQWarps * kQWarpRows;

template <int D>
struct BwdTiles {
  static constexpr int kQ = D == 128 ? 32 : 64;   // query tile of the dK/dV pass
  static constexpr int kK = 32;                   // key tile of the dQ pass (64 spills at 2 x 16 rows a warp)
  static constexpr size_t dkdv_smem = sizeof(bf16) * (D + 8) * (2 * kKVRows + 4 * kQ) + sizeof(float) * 4 * kQ;
  static constexpr size_t dq_smem = sizeof(bf16) * (D + 8) * (2 * kQRows + 4 * kK);
};

// delta[b, nq, s] = sum_t dout * o over rows of [s, b, nq, D]; D / 8 lanes per row.
template <int D>
__global__ void attn_delta_bf16_kernel(float* delta, const bf16* dout, const bf16* o, AttnShape a) {
  constexpr int L = D / 8;
  const int64_t rows = a.s * a.b * a.nq;
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / L;
  const int part = threadIdx.x % L;
  float sum = 0.0f;
  if (row < rows) {
    const uint4 x = *reinterpret_cast<const uint4*>(dout + row * D + part * 8);
    const uint4 y = *reinterpret_cast<const uint4*>(o + row * D + part * 8);
    const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&x);
    const __nv_bfloat162* yp = reinterpret_cast<const __nv_bfloat162*>(&y);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 xf = __bfloat1622float2(xp[i]), yf = __bfloat1622float2(yp[i]);
      sum += xf.x * yf.x + xf.y * yf.y;
    }
  }
#pragma unroll
  for (int off = L / 2; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (row < rows && part == 0) {
    const int64_t i = row / (a.b * a.nq), bb = (row / a.nq) % a.b, h = row % a.nq;
    delta[(bb * a.nq + h) * a.s + i] = sum;
  }
}

template <int D, bool DROP>
__global__ void __launch_bounds__(kKVThreads) attn_dkdv_mma_kernel(bf16* dk, bf16* dv, const bf16* dout, const bf16* q,
                                                                 const bf16* k, const bf16* v, const float* lse,
                                                                 const float* delta, AttnShape a) {
  constexpr int S = D + 8, kQ = BwdTiles<D>::kQ;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sK = reinterpret_cast<bf16*>(smem_raw);  // [kKVRows][S]
  bf16* sV = sK + kKVRows * S;                      // [kKVRows][S]
  bf16* sQ = sV + kKVRows * S;                      // [2][kQ][S]
  bf16* sdO = sQ + 2 * kQ * S;                    // [2][kQ][S]
  float* sL = reinterpret_cast<float*>(sdO + 2 * kQ * S);  // [2][kQ] lse * log2e (+inf past s)
  float* sD = sL + 2 * kQ;                                  // [2][kQ] delta (0 past s)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t grp = blockIdx.x, bb = grp / a.ng, g = grp % a.ng, group = a.nq / a.ng;
  const int64_t k0 = static_cast<int64_t>(blockIdx.y) * kKVRows;
  const int64_t q_stride = a.q_row, kv_stride = a.kv_row, o_stride = a.b * a.nq * D;
  const int64_t kv_base = bb * a.kv_batch + g * a.kv_group;
  const int kvalid = static_cast<int>(std::min<int64_t>(kKVRows, a.s - k0));
  load_tile<D, kKVRows, kKVThreads>(sK, k + k0 * kv_stride + kv_base, kv_stride, kvalid);
  load_tile<D, kKVRows, kKVThreads>(sV, v + k0 * kv_stride + kv_base, kv_stride, kvalid);

  const int64_t q_begin = a.causal ? k0 : 0;  // kQ divides kKVRows
  const int n_q = static_cast<int>((a.s - q_begin + kQ - 1) / kQ);
  const int total = static_cast<int>(group) * n_q;
  // issue tile `it` (head g * group + it / n_q, queries q_begin + (it % n_q) * kQ) into buffer `buf`
  auto issue = [&](int it, int buf) {
    const int64_t h = g * group + it / n_q, q0 = q_begin + static_cast<int64_t>(it % n_q) * kQ;
    const int valid = static_cast<int>(std::min<int64_t>(kQ, a.s - q0));
    const int64_t qoff = q0 * q_stride + bb * a.q_batch + g * a.q_group + (h - g * group) * D;
    load_tile<D, kQ, kKVThreads>(sQ + buf * kQ * S, q + qoff, q_stride, valid);
    load_tile<D, kQ, kKVThreads>(sdO + buf * kQ * S, dout + q0 * o_stride + (bb * a.nq + h) * D, o_stride, valid);
    if (threadIdx.x < kQ) {
      const int64_t qi = q0 + threadIdx.x, li = (bb * a.nq + h) * a.s + qi;
      sL[buf * kQ + threadIdx.x] = qi < a.s ? lse[li] * kLog2e : INFINITY;
      sD[buf * kQ + threadIdx.x] = qi < a.s ? delta[li] : 0.0f;
    }
    cp_async_commit();
  };
  issue(0, 0);

  const float sl2 = a.scale * kLog2e;
  const int64_t key_first = k0 + warp * 16;
  const int64_t key_lo = key_first + (lane >> 2);  // this thread's keys: key_lo, key_lo + 8
  float dk_acc[1][D / 8][4], dv_acc[1][D / 8][4];
  zero(dk_acc);
  zero(dv_acc);
  AttnDropout drop{};
  if constexpr (DROP) drop = AttnDropout::from(a);

  for (int it = 0; it < total; ++it) {
    cp_async_wait_all();
    __syncthreads();  // tile `it` visible; every warp is done with buffer (it + 1) & 1
    if (it + 1 < total) issue(it + 1, (it + 1) & 1);
    const int buf = it & 1;
    const int64_t q0 = q_begin + static_cast<int64_t>(it % n_q) * kQ;
    if (key_first >= a.s || (a.causal && key_first > q0 + kQ - 1)) continue;  // warp-uniform skip
    const bf16* cQ = sQ + buf * kQ * S;
    const bf16* cdO = sdO + buf * kQ * S;
    const float* cL = sL + buf * kQ;
    const float* cD = sD + buf * kQ;

    float st[1][kQ / 8][4], dpt[1][kQ / 8][4];
    zero(st);
    zero(dpt);
    warp_gemm_nk<D, kQ, S, 1>(st, sK, warp * 16, cQ);
    warp_gemm_nk<D, kQ, S, 1>(dpt, sV, warp * 16, cdO);

    const bool need_mask = a.causal && key_first + 15 > q0;  // queries past s have lse = +inf: p = 0
#pragma unroll
    for (int nb = 0; nb < kQ / 8; ++nb) {
      const int qc = nb * 8 + 2 * (lane & 3);
      const float2 lq = *reinterpret_cast<const float2*>(cL + qc);
      const float2 dq = *reinterpret_cast<const float2*>(cD + qc);
      float z[4];  // mask values of (query q0 + qc + (e & 1), key key_lo + 8 (e >> 1))
      if constexpr (DROP) {
        const int64_t h = g * group + it / n_q;
        drop.fragment_columns(z, AttnDropout::index(a, bb, h, q0 + qc, key_first + ((lane >> 2) & 4)), a.drop_s,
                              a.drop_aligned);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float p = fast_exp2(st[0][nb][e] * sl2 - ((e & 1) ? lq.y : lq.x));
        if (need_mask && key_lo + (e >> 1) * 8 > q0 + qc + (e & 1)) p = 0.0f;
        if constexpr (DROP) {
          st[0][nb][e] = p * z[e];
          dpt[0][nb][e] = p * (z[e] * dpt[0][nb][e] - ((e & 1) ? dq.y : dq.x));
        } else {
          st[0][nb][e] = p;
          dpt[0][nb][e] = p * (dpt[0][nb][e] - ((e & 1) ? dq.y : dq.x));
        }
      }
    }
    warp_gemm_reg_kn<kQ, D, S, 1>(dv_acc, st, cdO);
    warp_gemm_reg_kn<kQ, D, S, 1>(dk_acc, dpt, cQ);
  }

  const int valid = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(16, a.s - key_first)));
  const int64_t off = key_first * kv_stride + kv_base;
  const float mul_k[1][2] = {{a.scale, a.scale}}, mul_v[1][2] = {{1.0f, 1.0f}};
  store_rows<D, 1>(dk + off, kv_stride, valid, sK, warp * 16, dk_acc, mul_k);
  store_rows<D, 1>(dv + off, kv_stride, valid, sV, warp * 16, dv_acc, mul_v);
}

template <int D, bool DROP>
__global__ void __launch_bounds__(kQThreads) attn_dq_mma_kernel(bf16* dq, const bf16* dout, const bf16* q,
                                                               const bf16* k, const bf16* v, const float* lse,
                                                               const float* delta, AttnShape a) {
  constexpr int S = D + 8, kK = BwdTiles<D>::kK;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // [kQRows][S]
  bf16* sdO = sQ + kQRows * S;                     // [kQRows][S]
  bf16* sK = sdO + kQRows * S;                     // [2][kK][S]
  bf16* sV = sK + 2 * kK * S;                     // [2][kK][S]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t head = blockIdx.x, bb = head / a.nq, h = head % a.nq, hpg = a.nq / a.ng, g = h / hpg;
  const int64_t q0 = static_cast<int64_t>(gridDim.y - 1 - blockIdx.y) * kQRows;
  const int64_t q_stride = a.q_row, kv_stride = a.kv_row, o_stride = a.b * a.nq * D;
  const int64_t qhead = bb * a.q_batch + g * a.q_group + (h - g * hpg) * D;  // dq: the same layout
  const int64_t qoff = q0 * q_stride + qhead;
  const bf16* kp = k + bb * a.kv_batch + g * a.kv_group;
  const bf16* vp = v + bb * a.kv_batch + g * a.kv_group;
  const int64_t k_end = a.causal ? min(a.s, q0 + kQRows) : a.s;
  const int n_tiles = static_cast<int>((k_end + kK - 1) / kK);
  const int qvalid = static_cast<int>(std::min<int64_t>(kQRows, a.s - q0));
  load_tile<D, kQRows, kQThreads>(sQ, q + qoff, q_stride, qvalid);
  load_tile<D, kQRows, kQThreads>(sdO, dout + q0 * o_stride + (bb * a.nq + h) * D, o_stride, qvalid);
  load_tile<D, kK, kQThreads>(sK, kp, kv_stride, static_cast<int>(std::min<int64_t>(kK, a.s)));
  load_tile<D, kK, kQThreads>(sV, vp, kv_stride, static_cast<int>(std::min<int64_t>(kK, a.s)));
  cp_async_commit();

  const float sl2 = a.scale * kLog2e;
  const int r0 = warp * kQWarpRows;
  const int64_t row_first = q0 + r0, row_thr = row_first + (lane >> 2);  // rows row_thr + 16 mt + 8 hh
  float lse2[kQMT][2], dl[kQMT][2];
#pragma unroll
  for (int mt = 0; mt < kQMT; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int64_t row = row_thr + 16 * mt + 8 * hh, li = (bb * a.nq + h) * a.s + row;
      lse2[mt][hh] = row < a.s ? lse[li] * kLog2e : INFINITY;
      dl[mt][hh] = row < a.s ? delta[li] : 0.0f;
    }
  float acc[kQMT][D / 8][4];
  zero(acc);
  AttnDropout drop{};
  if constexpr (DROP) drop = AttnDropout::from(a);

  for (int t = 0; t < n_tiles; ++t) {
    cp_async_wait_all();
    __syncthreads();
    if (t + 1 < n_tiles) {
      const int64_t kn = static_cast<int64_t>(t + 1) * kK;
      const int valid = static_cast<int>(std::min<int64_t>(kK, a.s - kn));
      load_tile<D, kK, kQThreads>(sK + ((t + 1) & 1) * kK * S, kp + kn * kv_stride, kv_stride, valid);
      load_tile<D, kK, kQThreads>(sV + ((t + 1) & 1) * kK * S, vp + kn * kv_stride, kv_stride, valid);
      cp_async_commit();
    }
    const int64_t k0 = static_cast<int64_t>(t) * kK;
    if (a.causal && k0 > row_first + kQWarpRows - 1) continue;
    const bf16* cK = sK + (t & 1) * kK * S;
    const bf16* cV = sV + (t & 1) * kK * S;

    float sc[kQMT][kK / 8][4], dp[kQMT][kK / 8][4];
    zero(sc);
    zero(dp);
    warp_gemm_nk<D, kK, S, kQMT>(sc, sQ, r0, cK);
    warp_gemm_nk<D, kK, S, kQMT>(dp, sdO, r0, cV);

    const bool need_mask = k0 + kK > a.s || (a.causal && k0 + kK - 1 > row_first);
#pragma unroll
    for (int mt = 0; mt < kQMT; ++mt)
#pragma unroll
      for (int nb = 0; nb < kK / 8; ++nb) {
        float z[4];  // mask values of (row row_thr + 16 mt + 8 (e >> 1), key k0 + nb 8 + 2 (lane & 3) + (e & 1))
        if constexpr (DROP) {
          const uint64_t i0 = AttnDropout::index(a, bb, h, row_thr + 16 * mt, k0 + nb * 8 + 2 * (lane & 3));
          drop.fragment_rows(z, i0, i0 + 8 * a.drop_s, a.drop_aligned);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float p = fast_exp2(sc[mt][nb][e] * sl2 - lse2[mt][e >> 1]);
          if (need_mask) {
            const int64_t key = k0 + nb * 8 + 2 * (lane & 3) + (e & 1);
            if (key >= a.s || (a.causal && key > row_thr + 16 * mt + 8 * (e >> 1))) p = 0.0f;
          }
          if constexpr (DROP) dp[mt][nb][e] = p * (z[e] * dp[mt][nb][e] - dl[mt][e >> 1]);
          else dp[mt][nb][e] = p * (dp[mt][nb][e] - dl[mt][e >> 1]);
        }
      }
    warp_gemm_reg_kn<kK, D, S, kQMT>(acc, dp, cK);
  }

  const int valid = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(kQWarpRows, a.s - row_first)));
  const float mul[kQMT][2] = {{a.scale, a.scale}, {a.scale, a.scale}};
  store_rows<D, kQMT>(dq + row_first * q_stride + qhead, q_stride, valid, sQ, r0, acc, mul);
}

template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  MCPP_CUDA_CHECK_RT(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <int D>
void bwd(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v, const bf16* o,
         const float* lse, float* delta, const AttnShape& a, cudaStream_t s) {
  const int64_t lanes = a.s * a.b * a.nq * (D / 8);
  attn_delta_bf16_kernel<D><<<static_cast<unsigned>((lanes + 255) / 256), 256, 0, s>>>(delta, dout, o, a);
  MCPP_CUDA_LAUNCH_CHECK();
  using T = BwdTiles<D>;
  const unsigned kv_tiles = static_cast<unsigned>((a.s + kKVRows - 1) / kKVRows);
  const unsigned q_tiles = static_cast<unsigned>((a.s + kQRows - 1) / kQRows);
  const bool drop = a.drop_p > 0.0f;
  auto dkdv = drop ? attn_dkdv_mma_kernel<D, true> : attn_dkdv_mma_kernel<D, false>;
  allow_smem(dkdv, T::dkdv_smem);
  dkdv<<<dim3(static_cast<unsigned>(a.b * a.ng), kv_tiles), kKVThreads, T::dkdv_smem, s>>>(dk, dv, dout, q, k, v,
                                                                                         lse, delta, a);
  MCPP_CUDA_LAUNCH_CHECK();
  auto dqk = drop ? attn_dq_mma_kernel<D, true> : attn_dq_mma_kernel<D, false>;
  allow_smem(dqk, T::dq_smem);
  dqk<<<dim3(static_cast<unsigned>(a.b * a.nq), q_tiles), kQThreads, T::dq_smem, s>>>(dq, dout, q, k, v, lse, delta,
                                                                                   a);
  MCPP_CUDA_LAUNCH_CHECK();
}
}  // namespace

void launch_attention_bwd_mma(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                              const void* v, const void* o, const float* lse, float* delta, const AttnShape& a,
                              cudaStream_t s) {
  if (a.s <= 0 || a.b * a.nq <= 0) return;
  auto c = [](const void* p) { return static_cast<const bf16*>(p); };
  auto m = [](void* p) { return static_cast<bf16*>(p); };
  if (a.d == 64) bwd<64>(m(dq), m(dk), m(dv), c(dout), c(q), c(k), c(v), c(o), lse, delta, a, s);
  else bwd<128>(m(dq), m(dk), m(dv), c(dout), c(q), c(k), c(v), c(o), lse, delta, a, s);
}

}  // namespace mcpp::cuda_detail
