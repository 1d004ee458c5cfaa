// Device code for grouped_gemm.cpp (ops.inc grouped_linear_*): one launch computes the GEMM of every group of an
// expert-grouped buffer, the group sizes read from counts on the device (no host read: a CUDA graph replays with
// whatever counts the router wrote).
//   Tiles: each CTA owns one BM x BN tile of one group's C. Groups split M (forward / dgrad): the grid's x covers
//     ceil(rows / BM) + groups tiles (an upper bound: each group adds at most one partial tile); a CTA walks counts
//     to find its group and tile, CTAs past the last tile exit. Groups split K (wgrad): grid z = the group, the
//     reduction runs over the group's rows only (a group without rows writes zeros under overwrite, else nothing).
//   tensor cores (bf16): BM = BN = 128, BK = 32, 8 warps as 2 x 4 (64 x 32 each), mma.sync m16n8k16 with fp32
//     accumulators; operands staged by cp.async (16-byte chunks, zero-filled past the tile's bounds) into two
//     shared-memory stages, fragments by ldmatrix (.trans for an operand stored [k][m] / [k][n]) — attention_mma.cuh.
//   FMA (fp32, f16, or widths not multiples of 8): BM = BN = 64, BK = 16, each thread a 4 x 4 block in fp32.
//   The epilogue adds the group's bias (forward), or the old C (wgrad accumulate), and rounds once to C's dtype.
// The bias gradient: one thread per (column, group), a serial fp32 sum over the group's rows (deterministic).
// For the host-count path (grouped_gemm_lt.cpp): the biases added over host row ranges after a batched GEMM, and the
// writer of a batched GEMM's address tables, and the packing of its epilogue's biases.
#include <algorithm>

#include "mcpp/kernels/cuda/attention_mma.cuh"
#include "mcpp/kernels/cuda/device_utils.cuh"
#include "mcpp/kernels/cuda/grouped_gemm_launch.h"

namespace mcpp::cuda_detail {
namespace {
using mma::bf16;

struct Tile {
  int g;
  int64_t m0, m_hi;  // rows [m0, min(m0 + BM, m_hi)) of C
  int64_t k_lo, k_hi;
  bool ok;
};

template <int BM>
__device__ Tile find_tile(const GroupedGemmArgs& p) {
  if (p.group_rows_m) {
    int64_t t = blockIdx.x, lo = 0;
    for (int g = 0; g < p.groups; ++g) {
      const int64_t r = p.counts[g], tiles = (r + BM - 1) / BM;
      if (t < tiles) return {g, lo + t * BM, lo + r, 0, p.K, true};
      t -= tiles;
      lo += r;
    }
    return {0, 0, 0, 0, 0, false};
  }
  const int g = static_cast<int>(blockIdx.z);
  int64_t lo = 0;
  for (int i = 0; i < g; ++i) lo += p.counts[i];
  return {g, static_cast<int64_t>(blockIdx.x) * BM, p.M, lo, lo + p.counts[g], true};
}

// C(gm, gn) for the tile's group: acc plus the bias (forward) or the old value (wgrad accumulate).
__device__ __forceinline__ void store_c(const GroupedGemmArgs& p, const Tile& t, int64_t gm, int64_t gn, float v) {
  if (gm >= t.m_hi || gn >= p.N) return;
  if (p.group_rows_m) {
    const void* bias = p.bias[t.g];
    if (bias) v += FIn{bias, p.bias_kind}[gn];
    FOut{p.c[0], p.out_kind}.set(gm * p.ldc + gn, v);
  } else {
    const FOut c{p.c[t.g], p.out_kind};
    const int64_t i = gm * p.ldc + gn;
    c.set(i, p.overwrite ? v : c.get(i) + v);
  }
}

// ---- tensor cores
constexpr int kBM = 128, kBN = 128, kBK = 32, kThreads = 256;
constexpr int kSK = kBK + 8;   // row stride of a [m or n][k] stage
constexpr int kSM = kBM + 8;   // row stride of a [k][m or n] stage (kBM == kBN)
constexpr int kStage = kBM * kSK > kBK * kSM ? kBM * kSK : kBK * kSM;  // elements of one operand's stage

// One operand's BK-slice into shared memory. kmajor: [128][kSK] from rows x (outer = m or n) with k contiguous;
// else [kBK][kSM] from rows k with the outer index contiguous. Chunks outside [.., outer_hi) x [k, k_hi) are zero.
template <bool KMAJOR>
__device__ __forceinline__ void stage_operand(bf16* sm, const bf16* g, int64_t ld, int64_t outer0, int64_t outer_hi,
                                              int64_t k0, int64_t k_hi) {
#pragma unroll
  for (int j = 0; j < (kBM * kBK / 8) / kThreads; ++j) {
    const int c = threadIdx.x + j * kThreads;
    if (KMAJOR) {
      const int r = c / (kBK / 8), col = (c % (kBK / 8)) * 8;
      const int64_t go = outer0 + r, gk = k0 + col;
      const bool ok = go < outer_hi && gk < k_hi;
      mma::cp_async16(sm + r * kSK + col, ok ? g + go * ld + gk : g, ok);
    } else {
      const int r = c / (kBM / 8), col = (c % (kBM / 8)) * 8;
      const int64_t gk = k0 + r, go = outer0 + col;
      const bool ok = gk < k_hi && go < outer_hi;
      mma::cp_async16(sm + r * kSM + col, ok ? g + gk * ld + go : g, ok);
    }
  }
}

// A fragment (16 x 16 at rows m0, cols k0) from storage [k][m] (ldmatrix.trans): matrices (m 0-7, k 0-7),
// (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15) = a0..a3.
__device__ __forceinline__ void load_a_km(uint32_t (&a)[4], const bf16* sm, int k0, int m0) {
  const int lane = threadIdx.x & 31;
  mma::ldsm_x4_t(a, sm + (k0 + (lane & 7) + (lane >> 4) * 8) * kSM + m0 + ((lane >> 3) & 1) * 8);
}

template <bool A_K, bool B_K>
__global__ void __launch_bounds__(kThreads) grouped_gemm_mma_kernel(const __grid_constant__ GroupedGemmArgs p) {
  const Tile t = find_tile<kBM>(p);
  if (!t.ok) return;
  if (!p.group_rows_m && t.k_hi == t.k_lo && !p.overwrite) return;  // wgrad of a group without rows: += 0
  __shared__ __align__(16) bf16 smem[2][2][kStage];                  // [stage][A, B]
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kBN;
  const bf16* ga = static_cast<const bf16*>(p.a);
  const bf16* gb = static_cast<const bf16*>(p.group_rows_m ? p.b[t.g] : p.b[0]);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wm = warp >> 2, wn = warp & 3;  // 2 x 4 warps, 64 x 32 each
  float acc[4][4][4] = {};
  const int64_t nk = (t.k_hi - t.k_lo + kBK - 1) / kBK;
  auto stage = [&](int s, int64_t kt) {
    const int64_t k0 = t.k_lo + kt * kBK;
    stage_operand<A_K>(smem[s][0], ga, p.lda, t.m0, t.m_hi, k0, t.k_hi);
    stage_operand<B_K>(smem[s][1], gb, p.ldb, n0, p.N, k0, t.k_hi);
    mma::cp_async_commit();
  };
  if (nk > 0) stage(0, 0);
  for (int64_t kt = 0; kt < nk; ++kt) {
    mma::cp_async_wait_all();
    __syncthreads();  // stage kt landed; every warp finished reading the other stage
    if (kt + 1 < nk) stage(static_cast<int>((kt + 1) & 1), kt + 1);
    const bf16* sa = smem[kt & 1][0];
    const bf16* sb = smem[kt & 1][1];
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t a[4][4], b[2][4];
#pragma unroll
      for (int mi = 0; mi < 4; ++mi) {
        if (A_K) mma::load_a<kSK>(a[mi], sa, wm * 64 + mi * 16, kk);
        else load_a_km(a[mi], sa, kk, wm * 64 + mi * 16);
      }
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        if (B_K) mma::load_b_nk<kSK>(b[q], sb, wn * 32 + q * 16, kk);
        else mma::load_b_kn<kSM>(b[q], sb, kk, wn * 32 + q * 16);
      }
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) mma::mma16816(acc[mi][ni], a[mi], b[ni / 2][(ni % 2) * 2], b[ni / 2][(ni % 2) * 2 + 1]);
    }
  }
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
      const int64_t gm = t.m0 + wm * 64 + mi * 16 + (lane >> 2);
      const int64_t gn = n0 + wn * 32 + ni * 8 + (lane & 3) * 2;
      store_c(p, t, gm, gn, acc[mi][ni][0]);
      store_c(p, t, gm, gn + 1, acc[mi][ni][1]);
      store_c(p, t, gm + 8, gn, acc[mi][ni][2]);
      store_c(p, t, gm + 8, gn + 1, acc[mi][ni][3]);
    }
}

// ---- FMA (any float dtype, any widths)
constexpr int kFM = 64, kFN = 64, kFK = 16;

__global__ void __launch_bounds__(kThreads) grouped_gemm_fma_kernel(const __grid_constant__ GroupedGemmArgs p) {
  const Tile t = find_tile<kFM>(p);
  if (!t.ok) return;
  if (!p.group_rows_m && t.k_hi == t.k_lo && !p.overwrite) return;
  __shared__ float sa[kFK][kFM + 4], sb[kFK][kFN + 4];
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kFN;
  const FIn a{p.a, p.in_kind}, b{p.group_rows_m ? p.b[t.g] : p.b[0], p.in_kind};
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4] = {};
  for (int64_t k0 = t.k_lo; k0 < t.k_hi; k0 += kFK) {
    for (int e = threadIdx.x; e < kFM * kFK; e += kThreads) {
      const int r = p.a_kmajor ? e / kFK : e % kFM, kk = p.a_kmajor ? e % kFK : e / kFM;
      const int64_t gm = t.m0 + r, gk = k0 + kk;
      sa[kk][r] = gm < t.m_hi && gk < t.k_hi ? a[p.a_kmajor ? gm * p.lda + gk : gk * p.lda + gm] : 0.0f;
    }
    for (int e = threadIdx.x; e < kFN * kFK; e += kThreads) {
      const int c = p.b_kmajor ? e / kFK : e % kFN, kk = p.b_kmajor ? e % kFK : e / kFN;
      const int64_t gn = n0 + c, gk = k0 + kk;
      sb[kk][c] = gn < p.N && gk < t.k_hi ? b[p.b_kmajor ? gn * p.ldb + gk : gk * p.ldb + gn] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kFK; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        av[i] = sa[kk][ty * 4 + i];
        bv[i] = sb[kk][tx * 4 + i];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) store_c(p, t, t.m0 + ty * 4 + i, n0 + tx * 4 + j, acc[i][j]);
}

__global__ void grouped_bias_grad_kernel(const __grid_constant__ GroupedBiasGradArgs p) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int g = static_cast<int>(blockIdx.y);
  if (c >= p.n || !p.db[g]) return;
  int64_t lo = 0, hi = 0;
  if (p.counts) {
    for (int i = 0; i < g; ++i) lo += p.counts[i];
    hi = lo + p.counts[g];
  } else {
    lo = p.row_lo[g];
    hi = p.row_lo[g + 1];
  }
  float s = 0.0f;
  for (int64_t r = lo; r < hi; ++r) s += p.dy[r * p.n + c];
  const FOut db{p.db[g], p.db_kind};
  if (p.overwrite) db.set(c, s);
  else if (hi > lo) db.set(c, db.get(c) + s);
}

// One thread per (element of a row, group's row block): y += the group's bias, rounded once to y's dtype.
__global__ void grouped_bias_add_kernel(const __grid_constant__ GroupedBiasAddArgs p) {
  const int g = static_cast<int>(blockIdx.y);
  if (!p.bias[g]) return;
  const int64_t lo = p.row_lo[g], count = (p.row_lo[g + 1] - lo) * p.n;
  const FIn b{p.bias[g], p.bias_kind};
  const FOut y{p.y, p.y_kind};
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = lo * p.n + i;
    y.set(e, y.get(e) + b[i % p.n]);
  }
}

__global__ void pack_vectors_kernel(const __grid_constant__ PackVectorsArgs p) {
  const int g = static_cast<int>(blockIdx.y);
  const FIn v{p.v[g], p.kind};
  const FOut packed{p.packed, p.kind};
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < p.n;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x)
    packed.set(g * p.n + c, v[c]);  // exact: the same dtype
}

__global__ void pointer_table_kernel(const void** out, const __grid_constant__ PointerTableArgs p) {
  const int i = static_cast<int>(threadIdx.x);
  if (i < p.n) out[i] = p.p[i];
}
}  // namespace

void launch_grouped_gemm(const GroupedGemmArgs& a, bool tensor_cores, cudaStream_t s) {
  const int bm = tensor_cores ? kBM : kFM, bn = tensor_cores ? kBN : kFN;
  const int64_t m_tiles = a.group_rows_m ? (a.rows + bm - 1) / bm + a.groups : (a.M + bm - 1) / bm;
  const int64_t n_tiles = (a.N + bn - 1) / bn;
  if (m_tiles == 0 || n_tiles == 0) return;
  const dim3 grid(static_cast<unsigned>(m_tiles), static_cast<unsigned>(n_tiles),
                  a.group_rows_m ? 1u : static_cast<unsigned>(a.groups));
  if (!tensor_cores) grouped_gemm_fma_kernel<<<grid, kThreads, 0, s>>>(a);
  else if (a.a_kmajor && a.b_kmajor) grouped_gemm_mma_kernel<true, true><<<grid, kThreads, 0, s>>>(a);
  else if (a.a_kmajor) grouped_gemm_mma_kernel<true, false><<<grid, kThreads, 0, s>>>(a);
  else if (a.b_kmajor) grouped_gemm_mma_kernel<false, true><<<grid, kThreads, 0, s>>>(a);
  else grouped_gemm_mma_kernel<false, false><<<grid, kThreads, 0, s>>>(a);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_grouped_bias_grad(const GroupedBiasGradArgs& a, cudaStream_t s) {
  if (a.n == 0) return;
  const dim3 grid(static_cast<unsigned>((a.n + kThreads - 1) / kThreads), static_cast<unsigned>(a.groups));
  grouped_bias_grad_kernel<<<grid, kThreads, 0, s>>>(a);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_grouped_bias_add(const GroupedBiasAddArgs& a, cudaStream_t s) {
  if (a.n == 0 || a.groups == 0) return;
  int64_t most = 0;  // the largest group's elements
  for (int g = 0; g < a.groups; ++g) most = std::max(most, (a.row_lo[g + 1] - a.row_lo[g]) * a.n);
  if (most == 0) return;
  const int64_t blocks = std::min<int64_t>((most + kThreads - 1) / kThreads, 1024);
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(a.groups));
  grouped_bias_add_kernel<<<grid, kThreads, 0, s>>>(a);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_pack_vectors(const PackVectorsArgs& a, cudaStream_t s) {
  if (a.n == 0 || a.groups == 0) return;
  const int64_t blocks = std::min<int64_t>((a.n + kThreads - 1) / kThreads, 64);
  pack_vectors_kernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(a.groups)), kThreads, 0, s>>>(a);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_pointer_table(const void** out, const PointerTableArgs& a, cudaStream_t s) {
  if (a.n == 0) return;
  pointer_table_kernel<<<1, 3 * kMaxGroupedGemmGroups, 0, s>>>(out, a);
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
