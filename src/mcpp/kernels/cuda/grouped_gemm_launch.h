// The launchers of grouped_gemm_kernels.cu (kernels/cuda/grouped_gemm.cpp's device code), apart from launch.h so a
// change here recompiles these two files only. Plain C++ and the CUDA runtime, as launch.h.
#pragma once
#include "mcpp/kernels/cuda/launch.h"

namespace mcpp::cuda_detail {

// ---- grouped_gemm_kernels.cu (ops.inc grouped_linear_*): one launch for every group of an expert-grouped buffer.
// The GEMM C[M, N] = A[M, K] B[K, N] of each group, its sizes from counts (int64 [groups] on the device, read by the
// kernels only): group_rows = the M rows (forward, dgrad: each group's rows of A and C, B and bias per group) or
// the K rows (wgrad: each group's rows of A^T and B, C per group). a_kmajor: A(m, k) = a[m lda + k], else
// a[k lda + m]; b_kmajor: B(k, n) = b[n ldb + k], else b[k ldb + n]. One pointer for the whole buffer is entry 0.
// tensor_cores: bf16 operands with M, N, K... multiples of 8 and 16-byte aligned pointers (the host checks).
constexpr int kMaxGroupedGemmGroups = 128;
struct GroupedGemmArgs {
  const int64_t* counts;
  int groups;
  bool group_rows_m;                 // true: groups split M (fwd / dgrad); false: groups split K (wgrad)
  bool a_kmajor, b_kmajor;
  bool overwrite;                    // wgrad: C = (else +=) the product (groups without rows: zeros / untouched)
  int in_kind, out_kind, bias_kind;  // Kind of A and B, of C, of the biases
  int64_t rows;                      // the grouped buffer's rows (sum of counts)
  int64_t M, N, K;                   // K unused when groups split it, M when they split M
  int64_t lda, ldb, ldc;
  const void* a;
  const void* b[kMaxGroupedGemmGroups];     // per group (group_rows_m), else b[0]
  void* c[kMaxGroupedGemmGroups];           // per group (!group_rows_m), else c[0]
  const void* bias[kMaxGroupedGemmGroups];  // per group or null (group_rows_m only)
};
void launch_grouped_gemm(const GroupedGemmArgs& a, bool tensor_cores, cudaStream_t s);
// db[g][c] (+)= sum of dy[r, c] over group g's rows (dy [rows, n]); null entries skipped. The rows: from counts (on
// the device), or when counts is null group g's rows are [row_lo[g], row_lo[g + 1]) (the sizes known on the host).
struct GroupedBiasGradArgs {
  const int64_t* counts;
  int groups;
  bool overwrite;
  int db_kind;
  int64_t n;
  FIn dy;
  void* db[kMaxGroupedGemmGroups];
  int64_t row_lo[kMaxGroupedGemmGroups + 1];
};
void launch_grouped_bias_grad(const GroupedBiasGradArgs& a, cudaStream_t s);

// ---- The host-count path (grouped_gemm_lt.cpp: cuBLASLt GEMMs, the sizes known on the host).
// y[r, c] += bias[g][c] for the rows [row_lo[g], row_lo[g + 1]) of group g (y [rows, n], ld n; null biases skipped).
struct GroupedBiasAddArgs {
  int groups;
  int y_kind, bias_kind;
  int64_t n;
  void* y;
  const void* bias[kMaxGroupedGemmGroups];
  int64_t row_lo[kMaxGroupedGemmGroups + 1];
};
void launch_grouped_bias_add(const GroupedBiasAddArgs& a, cudaStream_t s);
// packed[g, c] = v[g][c] (packed [groups, n], one dtype): the per-group biases at the one stride a batched GEMM's
// epilogue reads them (CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE).
struct PackVectorsArgs {
  int groups;
  int kind;
  int64_t n;
  void* packed;
  const void* v[kMaxGroupedGemmGroups];
};
void launch_pack_vectors(const PackVectorsArgs& a, cudaStream_t s);
// out[i] = p[i] for i < n: a pointer-array batched GEMM's A / B / D address arrays, written on the stream (so a
// captured graph replays them with the call).
struct PointerTableArgs {
  int n;
  const void* p[3 * kMaxGroupedGemmGroups];
};
void launch_pointer_table(const void** out, const PointerTableArgs& a, cudaStream_t s);

}  // namespace mcpp::cuda_detail
