// cuBLASLt's FP8 matmul (Hopper), shared by the per-tensor FP8 ops (fp8.cpp) and the blockwise ones (fp8_block.cpp).
// Not part of the kernel interface (kernels/ops.h): only src/mcpp/kernels/cuda includes this.
//
// One call is the "TN" form, the only FP8 layout Hopper runs: D[m x n] (column-major, ld m) = op_T(A)[m x k] . B[k x n]
// (+ beta D), A stored k x m (ld k), B stored k x n (ld k) — in row-major terms D[n][m] = B[n][k] . A[m][k]^T, both
// operands with the reduction dim k contiguous. fp32 compute; D (= C) in the key's dtype.
// Scaling of A and B (CUBLASLT_MATMUL_DESC_{A,B}_SCALE_MODE; sa / sb are device float pointers, the dequantization
// factors):
//   Tensor      one float (CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, cuBLASLt's default; the attribute is not set);
//   Vec128      one float per 128 elements along k (VEC128_32F): for an operand row-major [rows][k], a
//               [k / 128][pad4(rows)] row-major array (Transformer Engine's GEMM-ready 1x128 layout);
//   Blk128x128  one float per 128 x 128 block (BLK128x128_32F): for an operand row-major [rows][k], a
//               [rows / 128][pad4(k / 128)] row-major array (Transformer Engine's GEMM-ready 2D layout).
// cuBLASLt takes Vec128 x Vec128, Vec128 x Blk128x128 and Blk128x128 x Vec128 (not 2D x 2D), without fast
// accumulation (cuBLAS 12.9+; CUDA 13 here). pad4(x) rounds up to a multiple of 4 (16-byte rows of scales).
// Plans (descriptors, layouts, the heuristic's candidate algorithms) are cached per key and operand alignment; the
// handle and workspace are the GEMMs' (gemm_lt.h). Autotuning as the bf16 GEMMs (kernels/gemm_autotune.h's switch,
// off under --deterministic-mode): a plan's first uncaptured call times its candidates on the call's operands (into
// a scratch) and keeps another than cuBLASLt's #0 only when >= 3% faster; one record each in gemm_tune_records.
#pragma once
#include <cuda_runtime.h>
#include <library_types.h>

#include <cstdint>

namespace mcpp::ops::cuda::fp8_detail {

enum class Fp8Scaling : int { Tensor = 0, Vec128 = 1, Blk128x128 = 2 };

struct Fp8GemmKey {
  int64_t m, n, k;
  int ta, tb, td;  // cudaDataType_t of A, B, D
  bool fast_accum;
  Fp8Scaling sa = Fp8Scaling::Tensor, sb = Fp8Scaling::Tensor;
  int tbias = -1;  // cudaDataType_t of a bias[m] added to every column (CUBLASLT_EPILOGUE_BIAS), -1: none
};

// D = scale(A) scale(B) op_T(A) B (+ beta D) with the key's shapes; a / b fp8 bytes, sa / sb device floats. The plan
// is cached per key and the pointers' alignments (the heuristic is told both, and real scale pointers: with a null
// one it picks kernels without that scaling, which cublasLtMatmul then refuses). try_fp8_gemm returns false, having
// run nothing, where cuBLASLt has no algorithm; fp8_gemm makes that a named error. bias: the key's bias vector (device,
// key.tbias >= 0), added in fp32 before D is rounded.
bool try_fp8_gemm(void* d, const Fp8GemmKey& key, const uint8_t* a, const float* sa, const uint8_t* b,
                  const float* sb, float beta, cudaStream_t s, const void* bias = nullptr);
void fp8_gemm(void* d, const Fp8GemmKey& key, const uint8_t* a, const float* sa, const uint8_t* b, const float* sb,
              float beta, cudaStream_t s, const void* bias = nullptr);

constexpr int64_t pad4(int64_t x) { return (x + 3) / 4 * 4; }

}  // namespace mcpp::ops::cuda::fp8_detail
