// The FP8 kernels' launchers (fp8_kernels.cu), called by fp8.cpp (the ops) — plain C++ + CUDA runtime, like
// launch.h. fmt: 0 = e4m3fn, 1 = e5m2 (ops.h Fp8Format). Every cast is q = cvt.rn.satfinite(float(in) * scale[0])
// (__nv_cvt_float_to_fp8 with __NV_SATFINITE), the CPU emulation's ops::fp8_round bit for bit. scale: device float [2]
// = {scale, scale_inv}; amax: device float [1] or null (when set: amax = max(amax, max |in|), an atomic max per
// block, so the launch may be one of several recording into one slot); sinv_out: device float [1] or null (when set:
// scale[1] is copied there, for a GEMM that needs its scale pointer aligned, fp8.cpp).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "mcpp/kernels/cuda/launch.h"

namespace mcpp::cuda_detail {

// q [n] fp8 bytes (null: not written); deq [n] (deq.p null: not written) = the fp8 value as deq's dtype.
void launch_fp8_cast(uint8_t* q, FOut deq, FIn in, int64_t n, const float* scale, float* amax, int fmt,
                     cudaStream_t s, float* sinv_out = nullptr);
// The bias gradient taken in a cast-transpose's pass (Transformer Engine's cast_transpose_dbias): db[cols] += the
// column sums of the input (fp32, deterministic); partial: fp32 scratch [fp8_dbias_parts(rows), cols]. db null: none.
struct Fp8Dbias {
  float* db = nullptr;
  float* partial = nullptr;
};
int64_t fp8_dbias_parts(int64_t rows);
// The activation a cast-transpose applies to its input first (ops.h Fp8Act), the result rounded to in's dtype as
// launch_gelu_fwd / launch_gelu_bwd / launch_norm_fwd / launch_swiglu_fwd / launch_swiglu_bwd write it: act 0 none,
// 1 gelu(in), 2 in * gelu'(aux) (aux: in's shape), 3 the norm of in's rows from their statistics (norm_apply:
// (in - mean[r]) rstd[r] gamma[c] + beta[c]; mean and beta null: RMSNorm), 4 swiglu of in [rows, 2 cols], 5 swiglu's
// gradient [dgate | dup] from in [rows, cols / 2] (the output's gradient) and aux [rows, cols] (the pre-activation).
struct Fp8CastAct {
  int act = 0;
  FIn aux{nullptr, kF32};
  const float* mean = nullptr;
  const float* rstd = nullptr;
  FIn gamma{nullptr, kF32}, beta{nullptr, kF32};
};
// in [rows, cols] -> q [rows, cols] (null: not written) and qt [cols, rows] (its transpose), both fp8 bytes.
void launch_fp8_cast_transpose(uint8_t* q, uint8_t* qt, FIn in, int64_t rows, int64_t cols, const float* scale,
                               float* amax, int fmt, cudaStream_t s, float* sinv_out = nullptr, Fp8Dbias dbias = {},
                               Fp8CastAct act = {});
void launch_fp8_amax(float* amax, FIn in, int64_t n, cudaStream_t s);
// One block: Transformer Engine's delayed-scaling update of scale [2] from history [len] (ops.h Fp8ScalingOptions).
constexpr int64_t kFp8MaxHistory = 8192;  // the history sits in shared memory (32 KiB)
void launch_fp8_scale_update(float* scale, float* history, int64_t len, float fp8_max, int margin, bool most_recent,
                             cudaStream_t s);
// Up to kMax tensors' updates in one launch (one block each; ops.inc fp8_scale_update_multi): tensor e's new amax is
// amax[slot[e]] (zeroed by the launch), its scale copied to before[e] first (null: not). Passed by value (~2.5 KB of
// kernel parameters).
struct Fp8ScaleUpdateBatch {
  static constexpr int kMax = 64;
  float* scale[kMax];
  float* before[kMax];
  float* history[kMax];
  int32_t len[kMax];
  int32_t slot[kMax];
  float fp8_max[kMax];
  int16_t margin[kMax];
  bool most_recent[kMax];
  float* amax;
  int count;
  int max_len;
};
void launch_fp8_scale_update_multi(const Fp8ScaleUpdateBatch& b, cudaStream_t s);

// ---- Blockwise scaling (fp8_block_kernels.cu; ops.h Fp8Block): every block's scale is Transformer Engine's
// power-of-2 compute_scale_from_amax (ops::fp8_block_scale bit for bit), the cast q = cvt.rn.satfinite(x * s) and the
// stored factor scale_inv = 1 / s (exact). A block's scale_inv goes to sinv[rb * s_row + cb * s_col] (rb, cb: the
// block's row and column index), so one kernel writes the GEMM-ready layouts (fp8_gemm.h) and the compact one.
struct BlockScaleOut {
  float* sinv;
  int64_t s_row, s_col;
};
// in [rows, cols] in 1x128 tiles along cols -> q [rows, cols] fp8 bytes. rows >= 1, cols a multiple of 128.
void launch_fp8_block_quantize_1x128(uint8_t* q, BlockScaleOut s, FIn in, int64_t rows, int64_t cols, int fmt,
                                     cudaStream_t st);
// in [rows, cols] in 128x1 tiles (along rows) -> qt [cols, rows], the transposed fp8 bytes (the wgrad's operand: its
// rows' 1x128 tiles). rows a multiple of 128, cols a multiple of 32.
void launch_fp8_block_quantize_128x1_t(uint8_t* qt, BlockScaleOut s, FIn in, int64_t rows, int64_t cols, int fmt,
                                       cudaStream_t st);
// in [rows, cols] in 128x128 blocks -> q [rows, cols] (null: not written) and qt [cols, rows] (null: not written);
// the transposed copy's scales go to st_out (its block (cb, rb); st_out.sinv null: not written). rows, cols multiples
// of 128.
void launch_fp8_block_quantize_128x128(uint8_t* q, uint8_t* qt, BlockScaleOut s, BlockScaleOut st_out, FIn in,
                                       int64_t rows, int64_t cols, int fmt, cudaStream_t st);
// The dequantized path's operand (fp8_block_gemm_path.h): out[r][c] = decode(q[r][c]) * sinv[(r / br) * s_row +
// (c / bc) * s_col] as out's dtype, q [rows, cols] fp8 bytes; (br, bc) = (1, 128) for 1x128 tiles along the columns,
// (128, 128) for blocks. Exact in bf16 (an fp8 value times a power of 2).
struct BlockScaleIn {
  const float* sinv;
  int64_t s_row, s_col;
  int64_t br, bc;  // the block's rows and columns
};
void launch_fp8_block_dequantize(FOut out, const uint8_t* q, BlockScaleIn s, int64_t rows, int64_t cols, int fmt,
                                 cudaStream_t st);
// out[i] = the fp8 byte q[i] decoded, as out's dtype (the quantize op's "out": the fp8 value, not scaled back).
void launch_fp8_decode(FOut out, const uint8_t* q, int64_t n, int fmt, cudaStream_t st);

}  // namespace mcpp::cuda_detail
