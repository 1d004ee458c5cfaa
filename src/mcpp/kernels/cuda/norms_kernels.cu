// Device code for norms.cpp (LayerNorm when mean != nullptr, RMSNorm otherwise), float32 math, with the
// fused residual add (fwd: sum = x + res, then the norm of the rounded sum; bwd: dx += dres).
// Two paths, chosen per call by the launchers:
//   vector path (h % 8 == 0, h <= 8192 and every pointer 16-byte aligned — the model's case), 16-byte
//     loads/stores (load8 / store8):
//     fwd: a row is held by a group of W = ceil(h / 256) warps (V = 1 chunk of 8 elements per thread up to
//          h = 2048; V <= 4; j = tid + k * 32W), R = 8 / W rows per block, as the bwd. A persistent grid
//          (SMs x occupancy blocks) strides over the rows; each row's raw x (and res) are loaded into
//          registers one row ahead (software prefetch), so loads stay in flight through the row's
//          statistics; x (or the rounded x + res, written to sum) stays in registers; two-pass statistics
//          (mean, then sum (x - mean)^2, no E[x^2] - mean^2 cancellation); rstd = rsqrt(var + eps) (biased
//          var) or rsqrt(mean(x^2) + eps). x and res of one element size (else the scalar path).
//     h <= 128 (per-head q/k norms): a row group of T lanes, T the power of two >= h / 8 (16 at h = 128), and
//          R = 256 / T rows per block, fwd and bwd; sums over the group by xor shuffles within it.
//     bwd: W = ceil(h / 256) warps per row (V = 1 chunk per thread up to h = 2048; V <= 4), R = 8 / W rows
//          per block; a persistent grid of G blocks (G = SMs x occupancy) strides over rows. Each row's
//          x, dy (and dres) are read from HBM once into registers (raw 16/32-byte chunks), and the next
//          row's loads are issued before this row's reduction (software prefetch, for V x elem bytes <= 4;
//          two rows ahead with dres at V = 1), so loads stay in flight through the block-wide sums (one
//          __syncthreads per row: the two row sums travel together, double-buffered shared memory).
//          dx = rstd (g - mean_h(g) [LN only] - xhat mean_h(g xhat)) (+ dres, added in fp32 before the one
//          rounding), g = dy gamma; each thread accumulates dy xhat (and dy; with the residual sums also
//          dres and the stored dx) for its own columns in registers; the block's R row groups are summed in
//          a fixed order into partial[G, h] rows (fp32 scratch); norm_param_reduce adds the G partials per
//          column in a fixed order into dgamma (dbeta, the sums). Deterministic run to run (for a given
//          G). Needs x, dy (and dres) of one element size (2 or 4 bytes).
//   scalar path (any h, any alignment): one block per row with FIn / FOut element access for fwd and the
//     dx part of bwd; the dgamma/dbeta sums of 256-row chunks go to partial rows (no atomics) that
//     norm_param_reduce adds in a fixed order: deterministic as the vector path.
// Residual dropout (NormDrop, launch.h; Megatron's bias-dropout-add): the fused forward drops the branch res
// in registers as launch_dropout would (kDrop instances: two Philox calls per thread and 8-element chunk,
// counters 2j and 2j + 1 of chunk j, as the vector dropout kernel), and the fused backward writes the
// branch's gradient dbranch = dropout_bwd(dx as stored) beside dx — no separate dropout pass either way.
#include <map>
#include <mutex>
#include <utility>

#include "mcpp/kernels/cuda/activation_math.cuh"
#include "mcpp/kernels/cuda/device_utils.cuh"
#include "mcpp/kernels/cuda/philox.cuh"

namespace mcpp::cuda_detail {
namespace {
constexpr int kRows = 256;
constexpr int kVecThreads = 256;  // most threads per block on the vector paths: 32W threads x R rows

int threads_for(int64_t h) { return h >= 1024 ? 512 : h >= 256 ? 256 : 128; }

// v rounded to the precision of `kind` (what a store + reload of that dtype gives).
__device__ __forceinline__ float round_as(int kind, float v) {
  if (kind == kBF16) return __bfloat162float(__float2bfloat16_rn(v));
  if (kind == kF16) return __half2float(__float2half_rn(v));
  return v;
}

// ---- residual dropout ------------------------------------------------------------------------------
// The key's offset with its device base (CUDA graphs) added: read once per thread.
__device__ __forceinline__ uint64_t drop_offset(const NormDrop& d) { return d.offset + (d.base ? *d.base : 0); }
// Branch value v of flat element idx after launch_dropout: v scale rounded to `kind`, or 0.
__device__ __forceinline__ float drop_one(const NormDrop& d, uint64_t off, uint64_t idx, int kind, float v) {
  return philox_uniform(philox_word_at(d.seed, off, idx)) >= d.p ? round_as(kind, __fmul_rn(v, d.scale)) : 0.0f;
}
// The same for the 8 elements of chunk j8 (flat elements 8 j8 .. 8 j8 + 7).
__device__ __forceinline__ void drop8(const NormDrop& d, uint64_t off, uint64_t j8, int kind, float (&v)[8]) {
  uint32_t w[8];
  philox_words8(d.seed, off, j8, w);
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = philox_uniform(w[e]) >= d.p ? round_as(kind, __fmul_rn(v[e], d.scale)) : 0.0f;
}

// ---- scalar path ----------------------------------------------------------------------------------
__global__ void norm_fwd_kernel(FOut y, FOut sum, float* mean_out, float* rstd_out, FIn x, FIn res, FIn gamma,
                                FIn beta, int64_t h, float eps, NormDrop drop) {
  __shared__ float scratch[33];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * h;
  if (res.p) {  // sum = x + res as launch_add; each thread later re-reads only the elements it wrote
    const uint64_t off = drop.p > 0.0f ? drop_offset(drop) : 0;
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
      float r = res[base + c];
      if (drop.p > 0.0f) r = drop_one(drop, off, static_cast<uint64_t>(base + c), res.kind, r);
      sum.set(base + c, x[base + c] + r);
    }
    x = FIn{sum.p, sum.kind};
  }
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
  for (int64_t c = threadIdx.x; y.p && c < h; c += blockDim.x) {
    float v = (x[base + c] - mu) * rs * gamma[c];
    if (beta.p) v += beta[c];
    y.set(base + c, v);
  }
}

__global__ void norm_bwd_input_kernel(FOut dx, FIn dy, FIn x, FIn dres, FIn gamma, const float* mean,
                                      const float* rstd, int64_t h, FOut dbranch, NormDrop drop) {
  __shared__ float scratch[33];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * h;
  const float mu = mean ? mean[blockIdx.x] : 0.0f, rs = rstd[blockIdx.x];
  const uint64_t drop_off = drop.p > 0.0f ? drop_offset(drop) : 0;
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
    float o = rs * (g - mean_g - xhat * mean_gx);
    if (dres.p) o = __fadd_rn(o, dres[base + c]);
    dx.set(base + c, o);
    if (drop.p > 0.0f)  // dbranch = launch_dropout of dx as stored
      dbranch.set(base + c,
                  drop_one(drop, drop_off, static_cast<uint64_t>(base + c), dbranch.kind, round_as(dx.kind, o)));
  }
}

// partial_g/b[blockIdx.y, h]: the sums of this 256-row chunk (no atomics; norm_param_reduce adds the chunks).
__global__ void norm_bwd_param_kernel(float* partial_g, float* partial_b, FIn dy, FIn x, const float* mean,
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
    partial_g[blockIdx.y * h + col] = sg;
    if (partial_b) partial_b[blockIdx.y * h + col] = sb;
  }
}

// ---- vector path: forward ------------------------------------------------------------------------
// The sum over a row group of T = blockDim.x < 32 lanes (a power of two: 32 / T rows share a warp), else over the
// warp (the xor butterfly from offset 16 down, as warp_sum: the same bits for T >= 32).
template <typename Tv>
__device__ __forceinline__ Tv group_sum(Tv v) {
  const int t = blockDim.x < 32 ? static_cast<int>(blockDim.x) : 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    if (o < t) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// Warps per row group: 1 for groups of <= 32 lanes.
__device__ __forceinline__ int row_warps() { return blockDim.x > 32 ? static_cast<int>(blockDim.x >> 5) : 1; }

// Sum over the 32W threads of one row group (threadIdx.x); W uniform in the block. s: [R][8] shared (W > 1:
// R <= 4).
__device__ __forceinline__ float row_sum(float v, int w, float (*s)[8]) {
  v = group_sum(v);
  if (w == 1) return v;
  __syncthreads();  // previous use of s done
  if ((threadIdx.x & 31) == 0) s[threadIdx.y][threadIdx.x >> 5] = v;
  __syncthreads();
  float r = 0.0f;
  for (int i = 0; i < w; ++i) r += s[threadIdx.y][i];
  return r;
}

// ---- vector path: backward -----------------------------------------------------------------------
// 8 elements of E bytes each as loaded: one uint4 (2-byte kinds) or two (float32).
template <int E>
struct Raw8 {
  uint4 u[E / 2];
};
template <int E>
__device__ __forceinline__ void load_raw(const void* p, int64_t j, Raw8<E>& r) {
#pragma unroll
  for (int i = 0; i < E / 2; ++i) r.u[i] = static_cast<const uint4*>(p)[(E / 2) * j + i];
}
template <int E>
__device__ __forceinline__ void zero_raw(Raw8<E>& r) {
#pragma unroll
  for (int i = 0; i < E / 2; ++i) r.u[i] = make_uint4(0u, 0u, 0u, 0u);
}
template <int E>
__device__ __forceinline__ void unpack8(const Raw8<E>& r, int kind, float (&v)[8]) {
  if constexpr (E == 4) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      v[4 * i] = __uint_as_float(r.u[i].x), v[4 * i + 1] = __uint_as_float(r.u[i].y);
      v[4 * i + 2] = __uint_as_float(r.u[i].z), v[4 * i + 3] = __uint_as_float(r.u[i].w);
    }
  } else {
    cuda_detail::unpack8(r.u[0], kind, v);  // 8 packed 2-byte values (device_utils.cuh)
  }
}

// One row's backward inputs for this thread's V chunks (zeros past the row end / for rows >= n).
template <int V, int E, bool kRes>
struct BwdRow {
  Raw8<E> x[V], dy[V], dres[kRes ? V : 1];
  float mu, rs;
};
template <int V, int E, bool kRes>
__device__ __forceinline__ void bwd_fetch(BwdRow<V, E, kRes>& r, int64_t row, int64_t n, int64_t vecs,
                                          const FIn& dy, const FIn& x, const FIn& dres, const float* mean,
                                          const float* rstd) {
  const bool valid = row < n;
  r.mu = (valid && mean) ? mean[row] : 0.0f;
  r.rs = valid ? rstd[row] : 0.0f;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    zero_raw(r.x[k]), zero_raw(r.dy[k]);
    if constexpr (kRes) zero_raw(r.dres[k]);
    if (valid && j < vecs) {
      load_raw(x.p, row * vecs + j, r.x[k]);
      load_raw(dy.p, row * vecs + j, r.dy[k]);
      if constexpr (kRes) load_raw(dres.p, row * vecs + j, r.dres[k]);
    }
  }
}

// (sum of v.x, sum of v.y) over the 32W threads of a row group; s = this iteration's [R][8] buffer of a
// double-buffered pair (a buffer is rewritten two rows later, after the next row's barrier: no second sync).
__device__ __forceinline__ float2 row_sum2(float2 v, int w, float2 (*s)[8]) {
  v.x = group_sum(v.x);
  v.y = group_sum(v.y);
  if (w == 1) return v;
  if ((threadIdx.x & 31) == 0) s[threadIdx.y][threadIdx.x >> 5] = v;
  __syncthreads();
  float2 r = make_float2(0.0f, 0.0f);
  for (int i = 0; i < w; ++i) r.x += s[threadIdx.y][i].x, r.y += s[threadIdx.y][i].y;
  return r;
}

// xhat = (x - mu) rs and dy of chunk k of a fetched row, as float (both phases unpack the same raw registers).
template <int V, int E, bool kRes>
__device__ __forceinline__ void bwd_unpack(const BwdRow<V, E, kRes>& r, int k, int xkind, int dykind,
                                           float (&xh)[8], float (&dv)[8]) {
  unpack8(r.x[k], xkind, xh);
  unpack8(r.dy[k], dykind, dv);
#pragma unroll
  for (int e = 0; e < 8; ++e) xh[e] = __fmul_rn(__fsub_rn(xh[e], r.mu), r.rs);  // explicit: see dx below
}

// out[0, h) = this block's column sums of acc: straight from registers (R = 1), else the R row groups folded
// through colsum ([R][32W][8] floats) in a fixed order.
template <int V>
__device__ __forceinline__ void write_partial(const float (&acc)[V][8], float* out, int64_t vecs, float* colsum) {
  const int tpr = blockDim.x;  // threads per row group
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(k) * tpr;
    if (blockDim.y == 1) {
      if (j < vecs) store8(FOut{out, kF32}, j, acc[k]);
      continue;
    }
    __syncthreads();
#pragma unroll
    for (int e = 0; e < 8; ++e) colsum[(threadIdx.y * tpr + threadIdx.x) * 8 + e] = acc[k][e];
    __syncthreads();
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

// partial[4][gridDim.x, h]: this block's column sums over the rows it visited of dy xhat (dgamma), dy
// (dbeta: when beta), and with kSums of dres and of dx as stored (the residual bias sums). kRes: dres.p !=
// nullptr. With dres at V = 1, rows are prefetched two ahead (three rows' raw inputs in registers, 2
// blocks/SM): measured faster than one ahead at 3 blocks/SM for the fused (3-input) backward, slower for the
// plain one; with kSums one ahead (the 16 more accumulators).
// kDrop: also dbranch = the dropout backward of dx as stored (the sums of dx are then dbranch's).
template <int V, int E, bool kRes, bool kSums = false, bool kDrop = false,
          int kDepth = (kRes && V == 1 && !kSums) ? 2 : 1>
__global__ void __launch_bounds__(kVecThreads, V == 1 ? (kRes ? 2 : 3) : 1)
    norm_bwd_vec_kernel(FOut dx, float* partial, bool beta, FIn dy, FIn x, FIn dres, FIn gamma, const float* mean,
                        const float* rstd, int64_t n, int64_t h, FOut dbranch, NormDrop drop) {
  static_assert(kRes || !kSums, "the residual sums need dres");
  static_assert(kRes || !kDrop, "the residual dropout needs dres");
  const uint64_t drop_off = kDrop ? drop_offset(drop) : 0;
  constexpr bool kPrefetch = V * E <= 4;  // registers for a second row's raw inputs
  __shared__ float2 red[2][8][8];            // [row parity][row group][warp]
  __shared__ float colsum[kVecThreads * 8];  // [R][32W][8]: the row groups' column partials
  const int w = row_warps();
  const int64_t vecs = h / 8;
  const float inv_h = 1.0f / static_cast<float>(h);
  float gm[V][8], ag[V][8], ab[V][8], ar[kSums ? V : 1][8], ad[kSums ? V : 1][8];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
#pragma unroll
    for (int e = 0; e < 8; ++e) gm[k][e] = ag[k][e] = ab[k][e] = 0.0f;
    if constexpr (kSums)
#pragma unroll
      for (int e = 0; e < 8; ++e) ar[k][e] = ad[k][e] = 0.0f;
    if (j < vecs) load8(gamma, j, gm[k]);
  }
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.y;
  const int64_t rows_here = (n + stride - 1) / stride;  // uniform trip count: row_sum2 synchronizes
  int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  BwdRow<V, E, kRes> cur, nxt, nxt2;
  bwd_fetch(cur, row, n, vecs, dy, x, dres, mean, rstd);
  if constexpr (kPrefetch && kDepth == 2) bwd_fetch(nxt, row + stride, n, vecs, dy, x, dres, mean, rstd);
  for (int64_t it = 0; it < rows_here; ++it, row += stride) {
    if constexpr (kPrefetch && kDepth == 2) bwd_fetch(nxt2, row + 2 * stride, n, vecs, dy, x, dres, mean, rstd);
    else if constexpr (kPrefetch) bwd_fetch(nxt, row + stride, n, vecs, dy, x, dres, mean, rstd);
    float2 s = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float xh[8], dv[8];
      bwd_unpack(cur, k, x.kind, dy.kind, xh, dv);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float gg = __fmul_rn(dv[e], gm[k][e]);  // explicit roundings, as dx below
        s.x = __fadd_rn(s.x, gg);
        s.y = __fmaf_rn(gg, xh[e], s.y);
      }
    }
    s = row_sum2(s, w, red[it & 1]);
    const float mean_g = mean ? s.x * inv_h : 0.0f, mean_gx = s.y * inv_h;
    if (row < n) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
        if (j < vecs) {
          float xh[8], dv[8], o[8], rr[8];
          bwd_unpack(cur, k, x.kind, dy.kind, xh, dv);
          if constexpr (kRes) unpack8(cur.dres[k], dres.kind, rr);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            // explicit roundings (no FMA contraction): the instances with and without dres (different code
            // around it) give the same bits, so fp32 dx + dres == bwd, then add_inplace
            const float t = __fsub_rn(__fsub_rn(__fmul_rn(dv[e], gm[k][e]), mean_g), __fmul_rn(xh[e], mean_gx));
            o[e] = __fmul_rn(cur.rs, t);
            if constexpr (kRes) o[e] = __fadd_rn(o[e], rr[e]);  // no FMA contraction: fp32 == bwd, then add
            ag[k][e] += dv[e] * xh[e];
            ab[k][e] += dv[e];
            if constexpr (kSums && !kDrop) ar[k][e] += rr[e], ad[k][e] += round_as(dx.kind, o[e]);  // dx as stored
          }
          store8(dx, row * vecs + j, o);
          if constexpr (kDrop) {  // dbranch = launch_dropout of dx as stored
            float db[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) db[e] = round_as(dx.kind, o[e]);
            drop8(drop, drop_off, static_cast<uint64_t>(row * vecs + j), dbranch.kind, db);
            store8(dbranch, row * vecs + j, db);
            if constexpr (kSums)
#pragma unroll
              for (int e = 0; e < 8; ++e) ar[k][e] += rr[e], ad[k][e] += db[e];  // db: rounded as stored
          }
        }
      }
    }
    if constexpr (kPrefetch) {
      cur = nxt;
      if constexpr (kDepth == 2) nxt = nxt2;
    } else bwd_fetch(cur, row + stride, n, vecs, dy, x, dres, mean, rstd);
  }
  // this block's partial rows (acc arrays passed by name, never selected at run time: they stay in registers)
  const int64_t slot = static_cast<int64_t>(gridDim.x) * h, mine = static_cast<int64_t>(blockIdx.x) * h;
  write_partial<V>(ag, partial + mine, vecs, colsum);
  if (beta) write_partial<V>(ab, partial + slot + mine, vecs, colsum);
  if constexpr (kSums) {
    write_partial<V>(ar, partial + 2 * slot + mine, vecs, colsum);
    write_partial<V>(ad, partial + 3 * slot + mine, vecs, colsum);
  }
}

// ---- vector path: forward ------------------------------------------------------------------------
// A persistent grid: each row group strides over the rows and issues the next row's raw loads before this
// row's statistics (software prefetch), as the backward above.
template <int V, int E, bool kRes>
struct FwdRow {
  Raw8<E> x[V], r[kRes ? V : 1];
};
template <int V, int E, bool kRes>
__device__ __forceinline__ void fwd_fetch(FwdRow<V, E, kRes>& f, int64_t row, int64_t n, int64_t vecs, const FIn& x,
                                          const FIn& res) {
  const bool valid = row < n;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    zero_raw(f.x[k]);
    if constexpr (kRes) zero_raw(f.r[k]);
    if (valid && j < vecs) {
      load_raw(x.p, row * vecs + j, f.x[k]);
      if constexpr (kRes) load_raw(res.p, row * vecs + j, f.r[k]);
    }
  }
}

// kDrop: the branch res dropped in registers first (drop8), as launch_dropout would store it.
template <int V, int E, bool kRes, bool kDrop = false>
__global__ void __launch_bounds__(kVecThreads) norm_fwd_vec_kernel(FOut y, FOut sum, float* mean_out,
                                                                    float* rstd_out, FIn x, FIn res, FIn gamma,
                                                                    FIn beta, int64_t n, int64_t h, float eps,
                                                                    NormDrop drop) {
  static_assert(kRes || !kDrop, "the residual dropout needs res");
  __shared__ float red[8][8];
  const uint64_t drop_off = kDrop ? drop_offset(drop) : 0;
  const int w = row_warps();
  const int64_t vecs = h / 8;
  const float inv_h = 1.0f / static_cast<float>(h);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.y;
  const int64_t rows_here = (n + stride - 1) / stride;  // uniform trip count: row_sum synchronizes
  int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  FwdRow<V, E, kRes> cur, nxt;
  fwd_fetch(cur, row, n, vecs, x, res);
  for (int64_t it = 0; it < rows_here; ++it, row += stride) {
    fwd_fetch(nxt, row + stride, n, vecs, x, res);
    const bool valid = row < n;
    float v[V][8];
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      unpack8(cur.x[k], x.kind, v[k]);
      if constexpr (kRes) {
        float r[8];
        unpack8(cur.r[k], res.kind, r);
        if constexpr (kDrop)
          if (valid && j < vecs) drop8(drop, drop_off, static_cast<uint64_t>(row * vecs + j), res.kind, r);
#pragma unroll
        for (int e = 0; e < 8; ++e) v[k][e] = round_as(sum.kind, __fadd_rn(v[k][e], r[e]));
        if (valid && j < vecs) store8(sum, row * vecs + j, v[k]);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) s += v[k][e];  // zeros past the row end
    }
    float mu = 0.0f;
    if (mean_out) mu = row_sum(s, w, red) * inv_h;
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      if (j < vecs)
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float d = __fsub_rn(v[k][e], mu);
          ss = __fmaf_rn(d, d, ss);  // explicit roundings: the same bits with and without res
        }
    }
    const float rs = rsqrtf(row_sum(ss, w, red) * inv_h + eps);
    if (valid) {
      if (threadIdx.x == 0) {
        if (mean_out) mean_out[row] = mu;
        rstd_out[row] = rs;
      }
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
        if (y.p && j < vecs) {  // (y null: the statistics only; an FP8 cast applies them: ops.h Fp8Act::Norm)
          float g[8], b[8] = {0, 0, 0, 0, 0, 0, 0, 0}, o[8];
          load8(gamma, j, g);
          if (beta.p) load8(beta, j, b);
#pragma unroll
          for (int e = 0; e < 8; ++e) o[e] = norm_apply(v[k][e], mu, rs, g[e], b[e]);
          store8(y, row * vecs + j, o);
        }
      }
    }
    cur = nxt;
  }
}

struct VecShape {
  int w, v, r;  // warps per row, chunks per thread, rows per block
  int t;        // threads per row (blockDim.x): 32 w, or for h <= 128 the power of two >= h / 8 (16 at h = 128)
};
// Forward and backward: as many warps per row as keep V = 1 (up to 8), so few registers per thread and many
// rows in flight. One layout for both norms forwards (plain and with the residual add): the same reduction
// tree, so the fused add + norm is bitwise the add, then the norm. (A plain forward with fewer warps per row
// and up to 4 chunks per thread measured ~10% faster alone, ~5% slower fused.)
// Rows of h <= 128 (per-head norms: --qk-layernorm) give a row group the fewest lanes that hold it in one chunk each
// and a block 256 / t rows: a whole warp per row would idle half of it at h = 128 and keep a quarter as many bytes in
// flight (measured ~35% of the copy ceiling on the qk norms of a 1.3B step).
VecShape vec_shape(int64_t h) {
  const int64_t vecs = h / 8;
  if (vecs > 4 * kVecThreads) return {0, 0, 0, 0};  // h > 8192: scalar path
  if (vecs <= 16) {
    int t = 1;
    while (t < vecs) t *= 2;
    return {1, 1, kVecThreads / t, t};
  }
  const int w = vecs <= kVecThreads ? static_cast<int>((vecs + 31) / 32) : 8;
  const int v = static_cast<int>((vecs + 32 * w - 1) / (32 * w));
  return {w, v, 8 / w, 32 * w};
}

using FwdKernel = void (*)(FOut, FOut, float*, float*, FIn, FIn, FIn, FIn, int64_t, int64_t, float, NormDrop);
template <int E, bool kRes, bool kDrop = false>
FwdKernel fwd_kernel_er(int v) {
  switch (v) {
    case 1: return norm_fwd_vec_kernel<1, E, kRes, kDrop>;
    case 2: return norm_fwd_vec_kernel<2, E, kRes, kDrop>;
    case 3: return norm_fwd_vec_kernel<3, E, kRes, kDrop>;
    default: return norm_fwd_vec_kernel<4, E, kRes, kDrop>;
  }
}
template <int E>
FwdKernel fwd_kernel_e(int v, bool res, bool drop) {
  if (drop) return fwd_kernel_er<E, true, true>(v);
  return res ? fwd_kernel_er<E, true>(v) : fwd_kernel_er<E, false>(v);
}
FwdKernel fwd_kernel(int v, int elem_bytes, bool res, bool drop) {
  return elem_bytes == 2 ? fwd_kernel_e<2>(v, res, drop) : fwd_kernel_e<4>(v, res, drop);
}

using BwdKernel = void (*)(FOut, float*, bool, FIn, FIn, FIn, FIn, const float*, const float*, int64_t, int64_t,
                           FOut, NormDrop);
template <int E, bool kRes, bool kSums, bool kDrop = false>
BwdKernel bwd_kernel_ers(int v) {
  switch (v) {
    case 1: return norm_bwd_vec_kernel<1, E, kRes, kSums, kDrop>;
    case 2: return norm_bwd_vec_kernel<2, E, kRes, kSums, kDrop>;
    case 3: return norm_bwd_vec_kernel<3, E, kRes, kSums, kDrop>;
    default: return norm_bwd_vec_kernel<4, E, kRes, kSums, kDrop>;
  }
}
template <int E>
BwdKernel bwd_kernel_e(int v, bool res, bool sums, bool drop) {
  if (drop) return sums ? bwd_kernel_ers<E, true, true, true>(v) : bwd_kernel_ers<E, true, false, true>(v);
  if (sums) return bwd_kernel_ers<E, true, true>(v);
  return res ? bwd_kernel_ers<E, true, false>(v) : bwd_kernel_ers<E, false, false>(v);
}
BwdKernel bwd_kernel(int v, int elem_bytes, bool res, bool sums, bool drop) {
  return elem_bytes == 2 ? bwd_kernel_e<2>(v, res, sums, drop) : bwd_kernel_e<4>(v, res, sums, drop);
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

// Resident blocks per SM of a kernel at `threads` threads per block, computed once per (kernel, threads).
int blocks_per_sm(const void* kernel, int threads) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> cache;
  const std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find({kernel, threads});
  if (it != cache.end()) return it->second;
  int b = 0;
  MCPP_CUDA_CHECK_RT(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, threads, 0));
  return cache[{kernel, threads}] = b < 1 ? 1 : b;
}
int bwd_blocks_per_sm(int v, int elem_bytes, bool res, bool sums, const VecShape& vs) {
  return blocks_per_sm(reinterpret_cast<const void*>(bwd_kernel(v, elem_bytes, res, sums, false)), vs.t * vs.r);
}

int elem_bytes(int kind) { return kind == kF32 ? 4 : 2; }

// The vector backward applies (h % 8 == 0, h <= 8192, one element size, 16-byte aligned pointers).
bool bwd_vector_ok(int64_t h, FOut dx, FIn dy, FIn x, FIn dres, FIn gamma, FOut dbranch) {
  const int e = elem_bytes(x.kind);
  return h % 8 == 0 && vec_shape(h).w > 0 && elem_bytes(dy.kind) == e && (!dres.p || elem_bytes(dres.kind) == e) &&
         vec8_ok(h, {dx.p, dy.p, x.p, dres.p, gamma.p, dbranch.p});
}
}  // namespace

// The grid (the partials' row partition) is that of the instance without the residual dropout, so dgamma /
// dbeta and the sums are the same bits with the dropout fused as with dropout_bwd run after the op.
int64_t norm_bwd_partial_blocks(int64_t n, int64_t h, FOut dx, FIn dy, FIn x, FIn dres, FIn gamma, bool sums,
                                FOut dbranch) {
  if (n <= 0) return 0;
  if (!bwd_vector_ok(h, dx, dy, x, dres, gamma, dbranch)) return (n + kRows - 1) / kRows;  // scalar: 256-row chunks
  const VecShape vs = vec_shape(h);
  const int e = elem_bytes(x.kind);
  const int64_t want = (n + vs.r - 1) / vs.r;
  const int64_t cap = static_cast<int64_t>(sm_count()) * bwd_blocks_per_sm(vs.v, e, dres.p != nullptr, sums, vs);
  return want < cap ? want : cap;
}

int64_t norm_bwd_scratch_floats(int64_t n, int64_t h, int64_t parts, bool sums) {
  if (!sums) return 2 * parts * h;
  const int64_t col = column_sum_parts(n) * h;  // the scalar path's column sums reuse the scratch
  return 4 * parts * h > col ? 4 * parts * h : col;
}

bool norm_fwd_vector_path(int64_t h, std::initializer_list<const void*> ptrs) {
  return vec_shape(h).w > 0 && vec8_ok(h, ptrs);
}

void launch_norm_fwd(FOut y, FOut sum, float* mean, float* rstd, FIn x, FIn res, FIn gamma, FIn beta, int64_t n,
                     int64_t h, float eps, cudaStream_t s, const NormDrop& drop) {
  if (n <= 0) return;
  const bool dropped = res.p && drop.on();
  const VecShape vs = vec_shape(h);
  if (norm_fwd_vector_path(h, {y.p, x.p, gamma.p, beta.p, res.p, res.p ? sum.p : nullptr}) &&
      (!res.p || elem_bytes(res.kind) == elem_bytes(x.kind))) {
    const FwdKernel k = fwd_kernel(vs.v, elem_bytes(x.kind), res.p != nullptr, dropped);
    const int64_t want = (n + vs.r - 1) / vs.r;
    const int64_t cap =
        static_cast<int64_t>(sm_count()) * blocks_per_sm(reinterpret_cast<const void*>(k), vs.t * vs.r);
    k<<<static_cast<unsigned>(want < cap ? want : cap), dim3(vs.t, vs.r), 0, s>>>(y, sum, mean, rstd, x, res, gamma,
                                                                                  beta, n, h, eps, drop);
  } else {
    norm_fwd_kernel<<<static_cast<unsigned>(n), threads_for(h), 0, s>>>(y, sum, mean, rstd, x, res, gamma, beta, h,
                                                                        eps, dropped ? drop : NormDrop{});
  }
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_norm_bwd(FOut dx, float* dgamma, float* dbeta, FIn dy, FIn x, FIn dres, FIn gamma, const float* mean,
                     const float* rstd, int64_t n, int64_t h, float* dres_sum, float* dx_sum, float* partial,
                     int64_t parts, cudaStream_t s, FOut dbranch, const NormDrop& drop) {
  if (n <= 0) return;
  const bool sums = dres.p && (dres_sum || dx_sum);
  const bool dropped = dres.p && drop.on();
  const NormDrop d = dropped ? drop : NormDrop{};
  const VecShape vs = vec_shape(h);
  if (bwd_vector_ok(h, dx, dy, x, dres, gamma, dbranch)) {
    const dim3 block(vs.t, vs.r);
    const BwdKernel k = bwd_kernel(vs.v, elem_bytes(x.kind), dres.p != nullptr, sums, dropped);
    k<<<static_cast<unsigned>(parts), block, 0, s>>>(dx, partial, dbeta != nullptr, dy, x, dres, gamma, mean, rstd, n,
                                                     h, dbranch, d);
    MCPP_CUDA_LAUNCH_CHECK();
    // partial rows: dgamma, dbeta, the dres sum, the dx sum (each [parts, h])
    launch_column_reduce_acc(ColumnReduceTargets{{dgamma, dbeta, dres_sum, dx_sum}}, sums ? 4 : dbeta ? 2 : 1,
                             partial, parts, h, s);
    return;
  }
  norm_bwd_input_kernel<<<static_cast<unsigned>(n), threads_for(h), 0, s>>>(dx, dy, x, dres, gamma, mean, rstd, h,
                                                                              dbranch, d);
  MCPP_CUDA_LAUNCH_CHECK();
  const dim3 grid(static_cast<unsigned>((h + 31) / 32), static_cast<unsigned>((n + kRows - 1) / kRows));
  norm_bwd_param_kernel<<<grid, dim3(32, 8), 0, s>>>(partial, dbeta ? partial + parts * h : nullptr, dy, x, mean,
                                                     rstd, n, h);
  MCPP_CUDA_LAUNCH_CHECK();
  launch_column_reduce_acc(ColumnReduceTargets{{dgamma, dbeta, nullptr, nullptr}}, dbeta ? 2 : 1, partial, parts, h,
                           s);
  if (sums) {  // the column-sum kernel over the inputs as stored; the scratch is reused in stream order
    if (dres_sum) launch_column_sum_acc(dres_sum, dres, n, h, partial, s);
    const FOut branch = dropped ? dbranch : dx;  // the branch's gradient as stored
    if (dx_sum) launch_column_sum_acc(dx_sum, FIn{branch.p, branch.kind}, n, h, partial, s);
  }
}

}  // namespace mcpp::cuda_detail
