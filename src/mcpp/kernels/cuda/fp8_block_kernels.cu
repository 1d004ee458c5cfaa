// FP8 blockwise quantize kernels (launchers declared in fp8_launch.h; --fp8-recipe blockwise). Memory bound: each
// reads its input once (the 128x128 kernel twice: the second read hits L2) and writes one byte per element plus a
// float per block. A block's amax uses fmaxf (a NaN never wins, as the CPU emulation's std::fmax); its scale is
// Transformer Engine's power-of-2 compute_scale_from_amax (ops::fp8_block_scale bit for bit).
//   1x128:      one warp per tile: 4 elements per lane, a shuffle max, the scale, the casts.
//   128x1 (t):  a 128 x 32 tile per block (32 x 8 threads) staged in shared memory: per-column amax over the 128
//               rows, then the transposed bytes written along the rows (the wgrad's K-contiguous operand).
//   128x128:    one 128 x 128 block per CUDA block (256 threads): the amax, then the casts, written row-major and /
//               or transposed through a shared byte tile.
//   dequantize: the dequantized GEMM path's operands (fp8_block_gemm_path.h): decode(q) * scale_inv, grid-stride.
#include <cuda_fp8.h>

#include <cfloat>

#include "mcpp/kernels/cuda/fp8_launch.h"

namespace mcpp::cuda_detail {
namespace {

constexpr int kBlock = 128;

__device__ __forceinline__ uint8_t to_fp8(float v, int fmt) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, fmt == 0 ? __NV_E4M3 : __NV_E5M2);
}

__device__ __forceinline__ float block_scale(float amax, int fmt) {
  if (isinf(amax) || isnan(amax) || amax == 0.0f) return 1.0f;
  float s = __fdiv_rn(fmt == 0 ? 448.0f : 57344.0f, amax);
  if (isinf(s)) s = FLT_MAX;
  return __uint_as_float(__float_as_uint(s) & 0xFF800000u);  // the mantissa cleared: a power of 2
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__global__ void quantize_1x128_kernel(uint8_t* q, BlockScaleOut so, FIn in, int64_t rows, int64_t cols, int fmt) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int64_t tiles_per_row = cols / kBlock;
  if (tile >= rows * tiles_per_row) return;  // a whole warp leaves together
  const int64_t r = tile / tiles_per_row, cb = tile % tiles_per_row;
  const int64_t base = r * cols + cb * kBlock;
  float v[4], m = 0.0f;
  for (int j = 0; j < 4; ++j) {
    v[j] = in[base + lane + 32 * j];
    m = fmaxf(m, fabsf(v[j]));
  }
  const float s = block_scale(warp_max(m), fmt);
  if (lane == 0) so.sinv[r * so.s_row + cb * so.s_col] = __frcp_rn(s);
  for (int j = 0; j < 4; ++j) q[base + lane + 32 * j] = to_fp8(__fmul_rn(v[j], s), fmt);
}

constexpr int kCols = 32, kRowsPerPass = 8;
__global__ void quantize_128x1_t_kernel(uint8_t* qt, BlockScaleOut so, FIn in, int64_t rows, int64_t cols, int fmt) {
  __shared__ float tile[kBlock][kCols + 1];
  __shared__ float part[kRowsPerPass][kCols];
  __shared__ float scale[kCols];
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kBlock, c0 = static_cast<int64_t>(blockIdx.x) * kCols;
  float m = 0.0f;
  for (int i = ty; i < kBlock; i += kRowsPerPass) {  // coalesced along the columns
    const float x = in[(r0 + i) * cols + c0 + tx];
    tile[i][tx] = x;
    m = fmaxf(m, fabsf(x));
  }
  part[ty][tx] = m;
  __syncthreads();
  if (ty == 0) {
    float a = 0.0f;
    for (int k = 0; k < kRowsPerPass; ++k) a = fmaxf(a, part[k][tx]);
    const float s = block_scale(a, fmt);
    scale[tx] = s;
    so.sinv[(r0 / kBlock) * so.s_row + (c0 + tx) * so.s_col] = __frcp_rn(s);
  }
  __syncthreads();
  for (int j = ty; j < kCols; j += kRowsPerPass)  // qt[c][r]: consecutive threads write consecutive rows
    for (int i = tx; i < kBlock; i += 32) qt[(c0 + j) * rows + r0 + i] = to_fp8(__fmul_rn(tile[i][j], scale[j]), fmt);
}

constexpr int kThreads2d = 256;
__global__ void quantize_128x128_kernel(uint8_t* q, uint8_t* qt, BlockScaleOut so, BlockScaleOut sto, FIn in,
                                        int64_t rows, int64_t cols, int fmt) {
  __shared__ uint8_t bytes[kBlock][kBlock + 4];  // 132: consecutive rows 33 words apart, no bank conflicts
  __shared__ float warp_amax[kThreads2d / 32];
  __shared__ float block_s;
  const int t = static_cast<int>(threadIdx.x);
  const int64_t rb = blockIdx.y, cb = blockIdx.x, r0 = rb * kBlock, c0 = cb * kBlock;
  const int c = t % kBlock, rstart = t / kBlock, rstep = kThreads2d / kBlock;  // 2 rows per pass, 128 columns
  float m = 0.0f;
  for (int r = rstart; r < kBlock; r += rstep) m = fmaxf(m, fabsf(in[(r0 + r) * cols + c0 + c]));
  m = warp_max(m);
  if (t % 32 == 0) warp_amax[t / 32] = m;
  __syncthreads();
  if (t == 0) {
    float a = 0.0f;
    for (int i = 0; i < kThreads2d / 32; ++i) a = fmaxf(a, warp_amax[i]);
    const float s = block_scale(a, fmt);
    block_s = s;
    so.sinv[rb * so.s_row + cb * so.s_col] = __frcp_rn(s);
    if (sto.sinv) sto.sinv[cb * sto.s_row + rb * sto.s_col] = __frcp_rn(s);
  }
  __syncthreads();
  const float s = block_s;
  for (int r = rstart; r < kBlock; r += rstep) {
    const uint8_t b = to_fp8(__fmul_rn(in[(r0 + r) * cols + c0 + c], s), fmt);
    if (q) q[(r0 + r) * cols + c0 + c] = b;
    bytes[r][c] = b;
  }
  if (!qt) return;
  __syncthreads();
  for (int j = rstart; j < kBlock; j += rstep)  // qt[c0 + j][r0 + i] = bytes[i][j], i = this thread's c
    qt[(c0 + j) * rows + r0 + c] = bytes[c][j];
}

__global__ void decode_kernel(FOut out, const uint8_t* q, int64_t n, int fmt) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(q[i], fmt == 0 ? __NV_E4M3 : __NV_E5M2);
    out.set(i, __half2float(__half(h)));
  }
}

__global__ void dequantize_kernel(FOut out, const uint8_t* q, BlockScaleIn s, int64_t rows, int64_t cols, int fmt) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const __half_raw h = __nv_cvt_fp8_to_halfraw(q[i], fmt == 0 ? __NV_E4M3 : __NV_E5M2);
    out.set(i, __fmul_rn(__half2float(__half(h)), s.sinv[(r / s.br) * s.s_row + (c / s.bc) * s.s_col]));
  }
}

}  // namespace

void launch_fp8_block_dequantize(FOut out, const uint8_t* q, BlockScaleIn s, int64_t rows, int64_t cols, int fmt,
                                 cudaStream_t st) {
  if (rows == 0 || cols == 0) return;
  constexpr int kThreads = 256;
  const int64_t b = (rows * cols + kThreads - 1) / kThreads;
  dequantize_kernel<<<static_cast<unsigned>(b < 8192 ? b : 8192), kThreads, 0, st>>>(out, q, s, rows, cols, fmt);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_fp8_block_quantize_1x128(uint8_t* q, BlockScaleOut s, FIn in, int64_t rows, int64_t cols, int fmt,
                                     cudaStream_t st) {
  const int64_t tiles = rows * (cols / kBlock);
  if (tiles == 0) return;
  constexpr int kThreads = 256, kTilesPerBlock = kThreads / 32;
  quantize_1x128_kernel<<<static_cast<unsigned>((tiles + kTilesPerBlock - 1) / kTilesPerBlock), kThreads, 0, st>>>(
      q, s, in, rows, cols, fmt);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_fp8_block_quantize_128x1_t(uint8_t* qt, BlockScaleOut s, FIn in, int64_t rows, int64_t cols, int fmt,
                                       cudaStream_t st) {
  if (rows == 0 || cols == 0) return;
  const dim3 grid(static_cast<unsigned>(cols / kCols), static_cast<unsigned>(rows / kBlock));
  quantize_128x1_t_kernel<<<grid, dim3(32, kRowsPerPass), 0, st>>>(qt, s, in, rows, cols, fmt);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_fp8_block_quantize_128x128(uint8_t* q, uint8_t* qt, BlockScaleOut s, BlockScaleOut st_out, FIn in,
                                       int64_t rows, int64_t cols, int fmt, cudaStream_t st) {
  if (rows == 0 || cols == 0) return;
  const dim3 grid(static_cast<unsigned>(cols / kBlock), static_cast<unsigned>(rows / kBlock));
  quantize_128x128_kernel<<<grid, kThreads2d, 0, st>>>(q, qt, s, st_out, in, rows, cols, fmt);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_fp8_decode(FOut out, const uint8_t* q, int64_t n, int fmt, cudaStream_t st) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  const int64_t b = (n + kThreads - 1) / kThreads;
  decode_kernel<<<static_cast<unsigned>(b < 4096 ? b : 4096), kThreads, 0, st>>>(out, q, n, fmt);
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
