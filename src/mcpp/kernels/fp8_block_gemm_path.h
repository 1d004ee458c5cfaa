// Which GEMM the CUDA blockwise FP8 ops (ops.inc fp8_block_linear_fwd / _bwd; --fp8-recipe blockwise) run, and a
// switch for tests. Two paths, the same operands (the quantize kernels' fp8 bytes and per-block scales):
//   block-scaled: cuBLASLt's block-scaled FP8 GEMM (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F / BLK128x128_32F; Hopper
//                 with cuBLAS 12.9+, kernels/cuda/fp8_gemm.h), taken wherever cuBLASLt has an algorithm;
//   dequantized:  both operands dequantized to bf16 (q * scale_inv: exact, an fp8 value times a power of 2) and one
//                 bf16 GEMM with fp32 accumulation — where cuBLASLt has no block-scaled algorithm for the shape and
//                 dtypes, or always after set_fp8_block_gemm_dequantize(true). Same values as the CPU emulation up to
//                 the fp32 accumulation order; slower (the bf16 copies, bf16 tensor cores).
// Backend-neutral declarations; without CUDA the stub keeps the switch and the counts stay zero.
#pragma once
#include <cstdint>

namespace mcpp::ops::cuda {

struct Fp8BlockGemmCounts {
  int64_t block_scaled = 0, dequantized = 0;  // GEMMs run on each path in this process
};
Fp8BlockGemmCounts fp8_block_gemm_counts();
void set_fp8_block_gemm_dequantize(bool on);  // force the dequantized path (default false)
bool fp8_block_gemm_dequantize();

}  // namespace mcpp::ops::cuda
