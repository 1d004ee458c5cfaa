// FP8 cast / cast-transpose / amax / delayed-scaling kernels (launchers declared in fp8_launch.h). Elementwise,
// memory bound: each reads its input once; the amax of the unscaled input is reduced per block (warp shuffles) and
// folded into the slot with one atomic max (non-negative floats order as their int bits). fmaxf drops NaNs from the
// amax (a NaN input still casts to NaN). The cast and the cast-transpose have 8-wide forms (16-byte loads, 8-byte
// fp8 stores: vec8_ok, every GEMM operand — its dims are multiples of 16) with the same per-element math, so the
// bytes and the amax are those of the scalar kernels.
#include <cuda_fp8.h>

#include "mcpp/kernels/cuda/activation_math.cuh"
#include "mcpp/kernels/cuda/device_utils.cuh"
#include "mcpp/kernels/cuda/fp8_launch.h"

namespace mcpp::cuda_detail {
namespace {

__device__ __forceinline__ uint8_t to_fp8(float v, int fmt) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, fmt == 0 ? __NV_E4M3 : __NV_E5M2);
}
__device__ __forceinline__ float from_fp8(uint8_t q, int fmt) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(q, fmt == 0 ? __NV_E4M3 : __NV_E5M2);
  return __half2float(__half(h));
}

// v rounded to a buffer kind's precision (what storing it there and reading it back gives).
__device__ __forceinline__ float round_to(float v, int kind) {
  if (kind == kBF16) return __bfloat162float(__float2bfloat16_rn(v));
  if (kind == kF16) return __half2float(__float2half_rn(v));
  return v;
}
// Element (r, c) of a cast's input [rows, cols] with Fp8CastAct's activation applied and rounded to in's kind, as the
// activation's own kernel writes it: in[r, c] (act 0), gelu (1), dy gelu' (2), the norm (3); Swiglu (4) reads
// in [rows, 2 cols] = [gate | up], DSwiglu (5) in [rows, cols / 2] (the gradient of swiglu's output) and aux
// [rows, cols] (the pre-activation), its output [dgate | dup].
template <int kAct>
__device__ __forceinline__ float load_act(const FIn& in, const Fp8CastAct& a, int64_t r, int64_t c, int64_t cols) {
  if constexpr (kAct == 4) return round_to(swiglu(in[r * 2 * cols + c], in[r * 2 * cols + cols + c]), in.kind);
  if constexpr (kAct == 5) {
    const int64_t f = cols / 2, j = c < f ? c : c - f;
    const float d = in[r * f + j], g = a.aux[r * cols + j], s = swiglu_sigmoid(g);
    return round_to(c < f ? swiglu_dgate(d, g, a.aux[r * cols + f + j], s) : swiglu_dup(d, g, s), in.kind);
  }
  const float v = in[r * cols + c];
  if constexpr (kAct == 1) return round_to(gelu(v), in.kind);
  if constexpr (kAct == 2) return round_to(v * gelu_grad(a.aux[r * cols + c]), in.kind);
  if constexpr (kAct == 3)
    return round_to(norm_apply(v, a.mean ? a.mean[r] : 0.0f, a.rstd[r], a.gamma[c], a.beta.p ? a.beta[c] : 0.0f),
                    in.kind);
  return v;
}
// The same for the 8 elements (r, c .. c + 8) (c and cols multiples of 8, DSwiglu: cols of 16; 16-byte aligned).
template <int kAct>
__device__ __forceinline__ void load_act8(float (&v)[8], const FIn& in, const Fp8CastAct& a, int64_t r, int64_t c,
                                          int64_t cols) {
  if constexpr (kAct == 4) {
    float u[8];
    load8(in, (r * 2 * cols + c) / 8, v);
    load8(in, (r * 2 * cols + cols + c) / 8, u);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = round_to(swiglu(v[k], u[k]), in.kind);
  } else if constexpr (kAct == 5) {
    const int64_t f = cols / 2, j = c < f ? c : c - f;  // f a multiple of 8: the 8 columns lie in one half
    float g[8], u[8];
    load8(in, (r * f + j) / 8, v);
    load8(a.aux, (r * cols + j) / 8, g);
    if (c < f) {
      load8(a.aux, (r * cols + f + j) / 8, u);
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = round_to(swiglu_dgate(v[k], g[k], u[k], swiglu_sigmoid(g[k])), in.kind);
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = round_to(swiglu_dup(v[k], g[k], swiglu_sigmoid(g[k])), in.kind);
    }
  } else {
    load8(in, (r * cols + c) / 8, v);
    if constexpr (kAct == 1 || kAct == 2) {
      float x[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if constexpr (kAct == 2) load8(a.aux, (r * cols + c) / 8, x);
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = round_to(kAct == 1 ? gelu(v[k]) : v[k] * gelu_grad(x[k]), in.kind);
    } else if constexpr (kAct == 3) {
      float g[8], b[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      load8(a.gamma, c / 8, g);
      if (a.beta.p) load8(a.beta, c / 8, b);
      const float mu = a.mean ? a.mean[r] : 0.0f, rs = a.rstd[r];
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = round_to(norm_apply(v[k], mu, rs, g[k], b[k]), in.kind);
    }
  }
}

// Reduces v over the block and atomically maxes it into *amax (thread 0). blockDim.x a multiple of 32, <= 1024.
__device__ void block_amax(float v, float* amax) {
  __shared__ float warp_max[32];
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warps = static_cast<int>(blockDim.x * blockDim.y) / 32;
  const int tid = static_cast<int>(threadIdx.y * blockDim.x + threadIdx.x);
  if (tid % 32 == 0) warp_max[tid / 32] = v;
  __syncthreads();
  if (tid == 0) {
    float m = 0.0f;
    for (int i = 0; i < warps; ++i) m = fmaxf(m, warp_max[i]);
    atomicMax(reinterpret_cast<int*>(amax), __float_as_int(m));  // m >= 0: int order = float order
  }
}

// sinv_out (null: none): the first thread copies scale[1], the scale_inv the cast's GEMM dequantizes with, there.
__device__ __forceinline__ void copy_scale_inv(float* sinv_out, const float* scale) {
  if (sinv_out && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0) *sinv_out = scale[1];
}

__global__ void cast_kernel(uint8_t* q, FOut deq, FIn in, int64_t n, const float* scale, float* amax, int fmt,
                            float* sinv_out) {
  copy_scale_inv(sinv_out, scale);
  const float s = scale[0];
  float m = 0.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = in[i];
    m = fmaxf(m, fabsf(x));
    const uint8_t b = to_fp8(__fmul_rn(x, s), fmt);
    if (q) q[i] = b;
    if (deq.p) deq.set(i, from_fp8(b, fmt));
  }
  if (amax) block_amax(m, amax);
}

// 8 casts of one vector, packed little-endian (byte k = element k), recording max |v| into m.
__device__ __forceinline__ uint2 cast8(const float (&v)[8], float s, int fmt, float& m) {
  uint32_t w[2] = {0u, 0u};
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    m = fmaxf(m, fabsf(v[k]));
    w[k / 4] |= static_cast<uint32_t>(to_fp8(__fmul_rn(v[k], s), fmt)) << (8 * (k % 4));
  }
  return make_uint2(w[0], w[1]);
}

// cast_kernel with 8 elements per thread (vec8_ok: n % 8 == 0, in, q and deq 16-byte aligned); n8 = n / 8.
__global__ void cast8_kernel(uint8_t* q, FOut deq, FIn in, int64_t n8, const float* scale, float* amax, int fmt,
                             float* sinv_out) {
  copy_scale_inv(sinv_out, scale);
  const float s = scale[0];
  float m = 0.0f;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n8;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v[8];
    load8(in, j, v);
    const uint2 b = cast8(v, s, fmt, m);
    if (q) reinterpret_cast<uint2*>(q)[j] = b;
    if (deq.p) {
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = from_fp8(static_cast<uint8_t>((k < 4 ? b.x : b.y) >> (8 * (k % 4))), fmt);
      store8(deq, j, v);
    }
  }
  if (amax) block_amax(m, amax);
}

__global__ void amax8_kernel(float* amax, FIn in, int64_t n8) {
  float m = 0.0f;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n8;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v[8];
    load8(in, j, v);
#pragma unroll
    for (int k = 0; k < 8; ++k) m = fmaxf(m, fabsf(v[k]));
  }
  block_amax(m, amax);
}

__global__ void amax_kernel(float* amax, FIn in, int64_t n) {
  float m = 0.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    m = fmaxf(m, fabsf(in[i]));
  block_amax(m, amax);
}

// 32 x 32 tiles, blockDim (32, 8): each thread casts 4 elements of a tile row-wise and writes 4 of the transpose.
// kDbias: the tile's column sums of the (activated) input to col_partial[blockIdx.y, cols], each thread's rows in
// order, then the 8 row lanes in order. kAct: Fp8CastAct's activation applied first.
constexpr int kTile = 32, kRowsPerPass = 8;
template <bool kDbias, int kAct>
__global__ void cast_transpose_kernel(uint8_t* q, uint8_t* qt, FIn in, int64_t rows, int64_t cols,
                                      const float* scale, float* amax, int fmt, float* sinv_out, float* col_partial,
                                      const Fp8CastAct act) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  copy_scale_inv(sinv_out, scale);
  const float s = scale[0];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  float m = 0.0f, csum = 0.0f;
  for (int j = threadIdx.y; j < kTile; j += kRowsPerPass) {
    const int64_t r = r0 + j, c = c0 + threadIdx.x;
    if (r < rows && c < cols) {
      const float x = load_act<kAct>(in, act, r, c, cols);
      m = fmaxf(m, fabsf(x));
      csum += x;
      const uint8_t b = to_fp8(__fmul_rn(x, s), fmt);
      tile[j][threadIdx.x] = b;
      if (q) q[r * cols + c] = b;
    }
  }
  if constexpr (kDbias) {
    __shared__ float lanes[kRowsPerPass][kTile + 1];
    lanes[threadIdx.y][threadIdx.x] = csum;
    __syncthreads();
    const int64_t c = c0 + threadIdx.x;
    if (threadIdx.y == 0 && c < cols) {
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < kRowsPerPass; ++i) sum += lanes[i][threadIdx.x];
      col_partial[static_cast<int64_t>(blockIdx.y) * cols + c] = sum;
    }
  }
  __syncthreads();
  for (int j = threadIdx.y; j < kTile; j += kRowsPerPass) {
    const int64_t c = c0 + j, r = r0 + threadIdx.x;  // qt[c, r] = q[r, c]
    if (r < rows && c < cols) qt[c * rows + r] = tile[threadIdx.x][j];
  }
  if (amax) block_amax(m, amax);
}

// cast_transpose_kernel for rows and cols multiples of 8 (16-byte aligned in, q, qt): 64 x 64 tiles, 256 threads,
// each casting 8 consecutive columns of a row per pass (16-byte load, 8-byte q store) into a shared byte tile, then
// writing 8 consecutive bytes of a qt row (8 tile rows of one column). kDbias (Transformer Engine's
// cast_transpose_dbias): the tile's column sums of the unscaled input go to col_partial[blockIdx.y, cols] too, each
// thread's rows in order, then the 32 row lanes in order (deterministic), so the bias gradient needs no second read.
// kAct: Fp8CastAct's activation applied first (the cast, amax and sums see the activated values).
constexpr int kVTile = 64, kVThreads = 256, kVRowsPerPass = kVThreads / (kVTile / 8);
template <bool kDbias, int kAct>
__global__ void cast_transpose8_kernel(uint8_t* q, uint8_t* qt, FIn in, int64_t rows, int64_t cols,
                                       const float* scale, float* amax, int fmt, float* sinv_out,
                                       float* col_partial, const Fp8CastAct act) {
  __shared__ __align__(8) uint8_t tile[kVTile][kVTile + 8];  // rows of 72 bytes: 8-byte aligned, fewer bank clashes
  copy_scale_inv(sinv_out, scale);
  const float s = scale[0];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kVTile, c0 = static_cast<int64_t>(blockIdx.x) * kVTile;
  const int tx = static_cast<int>(threadIdx.x) % (kVTile / 8), ty = static_cast<int>(threadIdx.x) / (kVTile / 8);
  float m = 0.0f;
  float csum[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // kDbias: this thread's rows of its 8 columns
  for (int j = ty; j < kVTile; j += kVRowsPerPass) {
    const int64_t r = r0 + j, c = c0 + 8 * tx;
    uint2 b = make_uint2(0u, 0u);
    if (r < rows && c < cols) {  // cols % 8 == 0: all 8 columns are inside
      float v[8];
      load_act8<kAct>(v, in, act, r, c, cols);
      b = cast8(v, s, fmt, m);
      if (q) *reinterpret_cast<uint2*>(q + r * cols + c) = b;
      if constexpr (kDbias) {
#pragma unroll
        for (int k = 0; k < 8; ++k) csum[k] += v[k];
      }
    }
    *reinterpret_cast<uint2*>(&tile[j][8 * tx]) = b;
  }
  if constexpr (kDbias) {  // [row lane][column] (+1 against bank clashes), then one thread per column adds the lanes
    __shared__ float lanes[kVRowsPerPass][kVTile + 1];
#pragma unroll
    for (int k = 0; k < 8; ++k) lanes[ty][8 * tx + k] = csum[k];
    __syncthreads();
    const int64_t c = c0 + threadIdx.x;
    if (threadIdx.x < kVTile && c < cols) {
      float sum = 0.0f;
#pragma unroll 8
      for (int i = 0; i < kVRowsPerPass; ++i) sum += lanes[i][threadIdx.x];
      col_partial[static_cast<int64_t>(blockIdx.y) * cols + c] = sum;
    }
  }
  __syncthreads();
  for (int j = ty; j < kVTile; j += kVRowsPerPass) {  // qt[c0 + j][r0 + 8 tx .. + 8) = tile[8 tx .. + 8)[j]
    const int64_t c = c0 + j, r = r0 + 8 * tx;
    if (c < cols && r < rows) {  // rows % 8 == 0
      uint32_t w[2] = {0u, 0u};
#pragma unroll
      for (int k = 0; k < 8; ++k) w[k / 4] |= static_cast<uint32_t>(tile[8 * tx + k][j]) << (8 * (k % 4));
      *reinterpret_cast<uint2*>(qt + c * rows + r) = make_uint2(w[0], w[1]);
    }
  }
  if (amax) block_amax(m, amax);
}

// One block's delayed-scaling update of scale [2] from history [len] (h: len floats of shared memory). new_amax
// (null: none) replaces history[0] and is zeroed: the amax a pass recorded in a slot of its own (fp8_scale_update_multi).
__device__ void scale_update_block(float* scale, float* history, int64_t len, float fp8_max, int margin,
                                   bool most_recent, float* h, float* new_amax) {
  __shared__ float result;
  __shared__ float warp_max[32];
  float m = 0.0f;
  bool nan = false;
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
    h[i] = i == 0 && new_amax ? *new_amax : history[i];
    nan = nan || isnan(h[i]);
    m = fmaxf(m, h[i]);
  }
  // torch.max over the history: a NaN wins (then the scale is kept, as _default_sf_compute's isfinite check does)
  nan = __syncthreads_or(nan);
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    float a = h[0];
    if (!most_recent) {
      a = 0.0f;
      for (int i = 0; i < static_cast<int>(blockDim.x / 32); ++i) a = fmaxf(a, warp_max[i]);
      if (nan) a = __int_as_float(0x7fc00000);
    }
    result = a;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x) history[i] = i + 1 < len ? h[i + 1] : h[0];  // roll(-1)
  if (threadIdx.x == 0) {
    history[0] = 0.0f;  // after the roll: len == 1 rolls onto itself
    if (new_amax) *new_amax = 0.0f;
    const float a = result;
    if (isfinite(a) && a > 0.0f) {
      const float sf = __fdiv_rn(__fdiv_rn(fp8_max, a), ldexpf(1.0f, margin));
      scale[0] = sf;
      scale[1] = __frcp_rn(sf);
    }
  }
}

__global__ void scale_update_kernel(float* scale, float* history, int64_t len, float fp8_max, int margin,
                                    bool most_recent) {
  extern __shared__ float h[];
  scale_update_block(scale, history, len, fp8_max, margin, most_recent, h, nullptr);
}

__global__ void scale_update_multi_kernel(const Fp8ScaleUpdateBatch b) {
  extern __shared__ float h[];
  const int e = blockIdx.x;
  if (threadIdx.x == 0 && b.before[e]) {  // thread 0 writes the new scale last: this reads the old one
    b.before[e][0] = b.scale[e][0];
    b.before[e][1] = b.scale[e][1];
  }
  scale_update_block(b.scale[e], b.history[e], b.len[e], b.fp8_max[e], b.margin[e], b.most_recent[e], h,
                     b.amax + b.slot[e]);
}

int blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

}  // namespace

void launch_fp8_cast(uint8_t* q, FOut deq, FIn in, int64_t n, const float* scale, float* amax, int fmt,
                     cudaStream_t s, float* sinv_out) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  if (vec8_ok(n, {in.p, q, deq.p}))
    cast8_kernel<<<blocks_for(n / 8, kThreads), kThreads, 0, s>>>(q, deq, in, n / 8, scale, amax, fmt, sinv_out);
  else
    cast_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(q, deq, in, n, scale, amax, fmt, sinv_out);
  MCPP_CUDA_LAUNCH_CHECK();
}

namespace {
template <bool kDbias, int kAct>
void cast_transpose8(dim3 grid, uint8_t* q, uint8_t* qt, FIn in, int64_t rows, int64_t cols, const float* scale,
                     float* amax, int fmt, cudaStream_t s, float* sinv_out, float* col_partial, const Fp8CastAct& act) {
  cast_transpose8_kernel<kDbias, kAct>
      <<<grid, kVThreads, 0, s>>>(q, qt, in, rows, cols, scale, amax, fmt, sinv_out, col_partial, act);
  MCPP_CUDA_LAUNCH_CHECK();
}
template <bool kDbias, int kAct>
void cast_transpose(dim3 grid, uint8_t* q, uint8_t* qt, FIn in, int64_t rows, int64_t cols, const float* scale,
                    float* amax, int fmt, cudaStream_t s, float* sinv_out, float* col_partial, const Fp8CastAct& act) {
  cast_transpose_kernel<kDbias, kAct>
      <<<grid, dim3(kTile, kRowsPerPass), 0, s>>>(q, qt, in, rows, cols, scale, amax, fmt, sinv_out, col_partial, act);
  MCPP_CUDA_LAUNCH_CHECK();
}
// Each form of a cast-transpose (8-wide or scalar, with or without the bias gradient) for the activation act.
template <int kAct>
void cast_transpose_any(bool vec, bool dbias, dim3 grid, uint8_t* q, uint8_t* qt, FIn in, int64_t rows, int64_t cols,
                        const float* scale, float* amax, int fmt, cudaStream_t s, float* sinv_out, float* partial,
                        const Fp8CastAct& act) {
  if (vec && dbias) cast_transpose8<true, kAct>(grid, q, qt, in, rows, cols, scale, amax, fmt, s, sinv_out, partial, act);
  else if (vec) cast_transpose8<false, kAct>(grid, q, qt, in, rows, cols, scale, amax, fmt, s, sinv_out, nullptr, act);
  else if (dbias) cast_transpose<true, kAct>(grid, q, qt, in, rows, cols, scale, amax, fmt, s, sinv_out, partial, act);
  else cast_transpose<false, kAct>(grid, q, qt, in, rows, cols, scale, amax, fmt, s, sinv_out, nullptr, act);
}
}  // namespace

void launch_fp8_cast_transpose(uint8_t* q, uint8_t* qt, FIn in, int64_t rows, int64_t cols, const float* scale,
                               float* amax, int fmt, cudaStream_t s, float* sinv_out, Fp8Dbias dbias,
                               Fp8CastAct act) {
  if (rows == 0 || cols == 0) return;
  const bool vec = rows % 8 == 0 && vec8_ok(cols, {in.p, q, qt, act.aux.p, act.gamma.p, act.beta.p}) &&
                   (act.act != 5 || cols % 16 == 0),
             db = dbias.db != nullptr;
  const int64_t tile = vec ? kVTile : kTile;
  const dim3 grid(static_cast<unsigned>((cols + tile - 1) / tile), static_cast<unsigned>((rows + tile - 1) / tile));
  if (act.act == 1)
    cast_transpose_any<1>(vec, db, grid, q, qt, in, rows, cols, scale, amax, fmt, s, sinv_out, dbias.partial, act);
  else if (act.act == 2)
    cast_transpose_any<2>(vec, db, grid, q, qt, in, rows, cols, scale, amax, fmt, s, sinv_out, dbias.partial, act);
  else if (act.act == 3)
    cast_transpose_any<3>(vec, db, grid, q, qt, in, rows, cols, scale, amax, fmt, s, sinv_out, dbias.partial, act);
  else if (act.act == 4)
    cast_transpose_any<4>(vec, db, grid, q, qt, in, rows, cols, scale, amax, fmt, s, sinv_out, dbias.partial, act);
  else if (act.act == 5)
    cast_transpose_any<5>(vec, db, grid, q, qt, in, rows, cols, scale, amax, fmt, s, sinv_out, dbias.partial, act);
  else
    cast_transpose_any<0>(vec, db, grid, q, qt, in, rows, cols, scale, amax, fmt, s, sinv_out, dbias.partial, act);
  if (db)  // the tiles' partial column sums -> db
    launch_column_reduce_acc(ColumnReduceTargets{{dbias.db, nullptr, nullptr, nullptr}}, 1, dbias.partial,
                             (rows + tile - 1) / tile, cols, s);
}

int64_t fp8_dbias_parts(int64_t rows) { return (rows + kTile - 1) / kTile; }  // the scalar form's tiles (the most)

void launch_fp8_amax(float* amax, FIn in, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  if (vec8_ok(n, {in.p})) amax8_kernel<<<blocks_for(n / 8, kThreads), kThreads, 0, s>>>(amax, in, n / 8);
  else amax_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(amax, in, n);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_fp8_scale_update(float* scale, float* history, int64_t len, float fp8_max, int margin, bool most_recent,
                             cudaStream_t s) {
  scale_update_kernel<<<1, 1024, static_cast<size_t>(len) * sizeof(float), s>>>(scale, history, len, fp8_max, margin,
                                                                               most_recent);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_fp8_scale_update_multi(const Fp8ScaleUpdateBatch& b, cudaStream_t s) {
  if (b.count == 0) return;
  scale_update_multi_kernel<<<b.count, 128, static_cast<size_t>(b.max_len) * sizeof(float), s>>>(b);
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
