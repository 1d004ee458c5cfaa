// fp8_gemm_probe: which per-tensor-scaled cuBLASLt FP8 GEMMs this GPU and cuBLASLt run. Each case builds the "TN"
// GEMM our fp8_gemm.cpp builds (D[m x n] = op_T(A) B, e4m3 operands, fp32 compute) and varies one thing: where the
// scale pointers point (a float at a 256-byte aligned address, at offset 4 — the scale_inv of a {scale, scale_inv}
// pair — or null at the heuristic query), the output type (bf16 / fp32), fast accumulation, the alignment preferences,
// C = D in place, and the shape. Prints one line per case: the heuristic's status and algorithm count, then
// cublasLtMatmul's status (0 = ran; 15 = CUBLAS_STATUS_NOT_SUPPORTED) and the cuBLASLt version.
// build: nvcc -O2 -arch=sm_90 -o fp8_gemm_probe fp8_gemm_probe.cu -lcublasLt
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define CK(x) do { auto e_ = (x); if (e_ != 0) { std::printf("error %d at %s:%d\n", (int)e_, __FILE__, __LINE__); std::exit(1); } } while (0)

struct Case {
  const char* name;
  int m, n, k;
  cudaDataType_t td;
  int scale_offset;   // floats from an aligned base; -1: no scale pointers at all
  bool null_at_heuristic, fast, align_prefs, separate_c;
};

int main() {
  cublasLtHandle_t h;
  CK(cublasLtCreate(&h));
  std::printf("cuBLASLt version %zu\n", cublasLtGetVersion());
  void *a, *b, *d, *c, *ws;
  float* scales;
  const size_t big = 4096L * 4096L * 4;
  CK(cudaMalloc(&a, big)); CK(cudaMalloc(&b, big)); CK(cudaMalloc(&d, big)); CK(cudaMalloc(&c, big));
  CK(cudaMalloc(&ws, 32 << 20)); CK(cudaMalloc(&scales, 256));
  CK(cudaMemset(a, 0x38, big)); CK(cudaMemset(b, 0x38, big)); CK(cudaMemset(d, 0, big)); CK(cudaMemset(c, 0, big));
  const float host_scales[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  CK(cudaMemcpy(scales, host_scales, sizeof(host_scales), cudaMemcpyHostToDevice));
  const Case cases[] = {
      {"ours: scale_inv at +4 B, bf16 out, fast", 768, 1024, 768, CUDA_R_16BF, 1, false, true, true, false},
      {"aligned scales, bf16 out, fast", 768, 1024, 768, CUDA_R_16BF, 0, false, true, true, false},
      {"scales at +16 B", 768, 1024, 768, CUDA_R_16BF, 4, false, true, true, false},
      {"scales at +8 B", 768, 1024, 768, CUDA_R_16BF, 2, false, true, true, false},
      {"+4 B, no fast accumulation", 768, 1024, 768, CUDA_R_16BF, 1, false, false, true, false},
      {"+4 B, no alignment preferences", 768, 1024, 768, CUDA_R_16BF, 1, false, true, false, false},
      {"+4 B, null at the heuristic", 768, 1024, 768, CUDA_R_16BF, 1, true, true, true, false},
      {"+4 B, separate C", 768, 1024, 768, CUDA_R_16BF, 1, false, true, true, true},
      {"+4 B, fp32 out (wgrad)", 768, 768, 1024, CUDA_R_32F, 1, false, false, true, false},
      {"aligned, fp32 out (wgrad)", 768, 768, 1024, CUDA_R_32F, 0, false, false, true, false},
      {"no scale pointers", 768, 1024, 768, CUDA_R_16BF, -1, false, true, true, false},
      {"aligned, 1.3B fc1 shape", 8192, 16384, 2048, CUDA_R_16BF, 0, false, true, true, false},
      {"+4 B, 1.3B fc1 shape", 8192, 16384, 2048, CUDA_R_16BF, 1, false, true, true, false},
  };
  for (const Case& cs : cases) {
    cublasLtMatmulDesc_t op;
    CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn)));
    const int8_t fast = cs.fast ? 1 : 0;
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
    const float* sp = cs.scale_offset >= 0 ? scales + cs.scale_offset : nullptr;
    const float* at_heuristic = cs.null_at_heuristic ? nullptr : sp;
    if (cs.scale_offset >= 0) {
      CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &at_heuristic, sizeof(sp)));
      CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &at_heuristic, sizeof(sp)));
    }
    cublasLtMatrixLayout_t la, lb, lc, ld;
    CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, cs.k, cs.m, cs.k));
    CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, cs.k, cs.n, cs.k));
    CK(cublasLtMatrixLayoutCreate(&lc, cs.td, cs.m, cs.n, cs.m));
    CK(cublasLtMatrixLayoutCreate(&ld, cs.td, cs.m, cs.n, cs.m));
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t wsb = 32 << 20;
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
    if (cs.align_prefs) {
      const uint32_t al = 256;
      for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
        CK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof(al)));
    }
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, cs.separate_c ? lc : ld, ld, pref, 1, &res,
                                                            &found);
    int ms = -1;
    if (hs == CUBLAS_STATUS_SUCCESS && found > 0) {
      if (cs.scale_offset >= 0) {
        CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sp, sizeof(sp)));
        CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sp, sizeof(sp)));
      }
      const float alpha = 1, beta = 0;
      ms = cublasLtMatmul(h, op, &alpha, a, la, b, lb, &beta, cs.separate_c ? c : d, cs.separate_c ? lc : ld, d, ld,
                          &res.algo, ws, wsb, 0);
      const cudaError_t ce = cudaDeviceSynchronize();
      if (ce != cudaSuccess) std::printf("  cuda error %d after the matmul\n", (int)ce);
    }
    std::printf("%-45s heuristic %d (found %d)  matmul %d\n", cs.name, (int)hs, found, ms);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc); cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
  }
  return 0;
}
