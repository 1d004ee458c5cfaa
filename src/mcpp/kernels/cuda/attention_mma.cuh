// Tensor-core building blocks of the bf16 flash attention kernels (attention_mma_{fwd,bwd}_kernels.cu):
// cp.async tile loads into padded shared memory, ldmatrix fragment loads and mma.sync m16n8k16
// (bf16 x bf16 -> fp32), all sm_80+ (no wgmma/TMA).
//
// Contract:
//   Tiles live in shared memory row-major with a row stride of D + 8 bf16 (16 bytes of padding: the 8 rows
//   one ldmatrix reads start 4 banks apart, so fragment loads and cp.async stores are conflict-free).
//   load_tile: rows [0, ROWS) of a [*, D] global operand whose row r starts at g + r * row_stride elements;
//     rows >= valid are zero-filled (cp.async src-size 0). g and row_stride * 2 bytes must be 16-byte aligned.
//   Fragment layouts are PTX's for mma.m16n8k16.row.col (g = lane / 4, t = lane % 4):
//     A 16x16 (4 regs): a0 (row g, cols 2t..2t+1), a1 (row g+8), a2 (row g, cols 2t+8..), a3 (row g+8, +8)
//     B 16x8  (2 regs): b0 (k 2t..2t+1, col g), b1 (k 2t+8.., col g)
//     C 16x8  (4 fp32): c0,c1 (row g, cols 2t, 2t+1), c2,c3 (row g+8, same cols)
//   load_a(sm, r0, c0):   A = sm[r0..r0+16)[c0..c0+16)
//   load_b_nk(sm, n0, k0): B for two 8-col blocks n0, n0+8 from storage [n][k] (B[k][n] = sm[n][k]):
//                          b[0], b[1] -> cols n0..n0+8, b[2], b[3] -> cols n0+8..n0+16, k = k0..k0+16
//   load_b_kn(sm, k0, n0): the same from storage [k][n] (ldmatrix.trans)
//   a_from_c(c0, c1):     the A fragment (k = 16 columns) made of two C tiles (cols 0..8 and 8..16), as bf16
//   warp_gemm_*:          a warp's product over MT stacked 16-row tiles (MT B-fragment reuse)
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace mcpp::cuda_detail::mma {

using bf16 = __nv_bfloat16;
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const int n = valid ? 16 : 0;  // 0 source bytes: the 16 destination bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ float fast_exp2(float x) {  // ex2.approx: 2^-inf = +0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<const uint32_t*>(&v);
}

template <int D, int ROWS, int NT>
__device__ __forceinline__ void load_tile(bf16* sm, const bf16* g, int64_t row_stride, int valid) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
#pragma unroll
  for (int c = threadIdx.x; c < ROWS * kChunks; c += NT) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool ok = r < valid;
    cp_async16(sm + r * (D + 8) + col, g + (ok ? r * row_stride : 0) + col, ok);
  }
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

template <int STRIDE>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* sm, int r0, int c0) {
  const int lane = threadIdx.x & 31;
  ldsm_x4(a, sm + (r0 + (lane & 15)) * STRIDE + c0 + (lane >> 4) * 8);
}
template <int STRIDE>
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], const bf16* sm, int n0, int k0) {
  const int lane = threadIdx.x & 31;
  ldsm_x4(b, sm + (n0 + (lane & 7) + (lane >> 4) * 8) * STRIDE + k0 + ((lane >> 3) & 1) * 8);
}
template <int STRIDE>
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const bf16* sm, int k0, int n0) {
  const int lane = threadIdx.x & 31;
  ldsm_x4_t(b, sm + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * STRIDE + n0 + (lane >> 4) * 8);
}

__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void a_from_c(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

// A warp owns MT row tiles of 16 rows (rows r0 + 16 mt ..): each B fragment it loads feeds MT products.
// acc[mt][16 rows][N] += A[16 x KD] (rows r0 + 16 mt.. of sA, [row][k]) * B, B[k][n] = sB[n][k].
template <int KD, int N, int STRIDE, int MT>
__device__ __forceinline__ void warp_gemm_nk(float (&acc)[MT][N / 8][4], const bf16* sA, int r0, const bf16* sB) {
#pragma unroll
  for (int kk = 0; kk < KD / 16; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) load_a<STRIDE>(a[mt], sA, r0 + 16 * mt, kk * 16);
#pragma unroll
    for (int nb = 0; nb < N / 16; ++nb) {
      uint32_t b[4];
      load_b_nk<STRIDE>(b, sB, nb * 16, kk * 16);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma16816(acc[mt][2 * nb], a[mt], b[0], b[1]);
        mma16816(acc[mt][2 * nb + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// acc[mt][16][N] += P_mt[16 x K] (registers, C layout: p[mt][K/8][4], rounded to bf16) * sB[k][n].
template <int K, int N, int STRIDE, int MT>
__device__ __forceinline__ void warp_gemm_reg_kn(float (&acc)[MT][N / 8][4], const float (&p)[MT][K / 8][4],
                                                 const bf16* sB) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) a_from_c(a[mt], p[mt][2 * kk], p[mt][2 * kk + 1]);
#pragma unroll
    for (int nb = 0; nb < N / 16; ++nb) {
      uint32_t b[4];
      load_b_kn<STRIDE>(b, sB, kk * 16, nb * 16);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma16816(acc[mt][2 * nb], a[mt], b[0], b[1]);
        mma16816(acc[mt][2 * nb + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

template <int MT, int N>
__device__ __forceinline__ void zero(float (&acc)[MT][N][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < N; ++i) acc[mt][i][0] = acc[mt][i][1] = acc[mt][i][2] = acc[mt][i][3] = 0.0f;
}

// Stores a warp's 16 MT x D fp32 tile (C layout; row tile mt's rows g / g + 8 times mul[mt][0] / [1]) as
// bf16 rows [r0, r0 + 16 MT) of the padded smem tile sm, then copies those rows to global rows r
// (r < valid) at g + r * row_stride with 16-byte stores. The caller owns those smem rows (no other warp
// reads them); __syncwarp orders the lanes.
template <int D, int MT>
__device__ __forceinline__ void store_rows(bf16* g, int64_t row_stride, int valid, bf16* sm, int r0,
                                           const float (&acc)[MT][D / 8][4], const float (&mul)[MT][2]) {
  constexpr int S = D + 8;
  const int lane = threadIdx.x & 31, gr = lane >> 2, t = lane & 3;
  __syncwarp();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int db = 0; db < D / 8; ++db) {
      const int col = db * 8 + 2 * t, row = r0 + 16 * mt + gr;
      *reinterpret_cast<uint32_t*>(sm + row * S + col) =
          pack_bf16(acc[mt][db][0] * mul[mt][0], acc[mt][db][1] * mul[mt][0]);
      *reinterpret_cast<uint32_t*>(sm + (row + 8) * S + col) =
          pack_bf16(acc[mt][db][2] * mul[mt][1], acc[mt][db][3] * mul[mt][1]);
    }
  __syncwarp();
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int c = lane; c < 16 * MT * kChunks; c += 32) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    if (r < valid)
      *reinterpret_cast<uint4*>(g + r * row_stride + col) = *reinterpret_cast<const uint4*>(sm + (r0 + r) * S + col);
  }
}

}  // namespace mcpp::cuda_detail::mma
