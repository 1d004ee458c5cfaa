// What the batched GEMM probes share (batched_probe.cu, batched_epilogue_probe.cu; each built by one nvcc line, this
// header found next to them): the MoE layer they time, their cuBLASLt handle / stream / workspace, CK (exit on a CUDA /
// cuBLAS error, naming the line), a deterministic bf16 fill, and the median time of a launch sequence.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#define CK(x)                                                                         \
  do {                                                                                \
    auto e_ = (x);                                                                    \
    if (e_ != 0) {                                                                    \
      std::printf("error %d at %s:%d\n", static_cast<int>(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

namespace moe_probe {
// GPT-2 124M MoE shapes padded to capacity: 8 experts x 4,096 rows (top-2 of B16 x T1024, capacity factor 1.0), h 768,
// ffn 3072
constexpr int E = 8, H = 768, F = 3072, CAP = 4096, ROWS = E * CAP;
constexpr size_t kWorkspace = 32u << 20;
inline cublasLtHandle_t lt;
inline cudaStream_t s;
inline void* workspace;  // kWorkspace bytes

// cuBLASLt's heuristic candidates for the GEMM (at most 8, its order; none when it has no algorithm for it).
inline std::vector<cublasLtMatmulAlgo_t> candidates(cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la,
                                                    cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld) {
  cublasLtMatmulPreference_t pref;
  CK(cublasLtMatmulPreferenceCreate(&pref));
  CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspace,
                                          sizeof(kWorkspace)));
  cublasLtMatmulHeuristicResult_t res[8];
  int found = 0;
  if (cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 8, res, &found) != CUBLAS_STATUS_SUCCESS) found = 0;
  CK(cublasLtMatmulPreferenceDestroy(pref));
  std::vector<cublasLtMatmulAlgo_t> out;
  for (int i = 0; i < found; ++i) out.push_back(res[i].algo);
  return out;
}
}  // namespace moe_probe

// x[i] = scale * sin(0.37 (i mod 99991) + phase), rounded to bf16.
__global__ void fill_bf16(__nv_bfloat16* x, long n, float scale, float phase = 1.3f) {
  const long step = static_cast<long>(gridDim.x) * blockDim.x;
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += step)
    x[i] = __float2bfloat16(scale * __sinf(0.37f * static_cast<float>(i % 99991) + phase));
}

// us per call of body on s: 3 warm-up calls, then the median of 7 rounds of 10 calls timed by events.
inline float time_us(cudaStream_t s, const std::function<void()>& body) {
  cudaEvent_t t0, t1;
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  for (int i = 0; i < 3; ++i) body();
  std::vector<float> v;
  for (int r = 0; r < 7; ++r) {
    CK(cudaEventRecord(t0, s));
    for (int i = 0; i < 10; ++i) body();
    CK(cudaEventRecord(t1, s));
    CK(cudaEventSynchronize(t1));
    float ms;
    CK(cudaEventElapsedTime(&ms, t0, t1));
    v.push_back(ms * 1000 / 10);
  }
  std::sort(v.begin(), v.end());
  CK(cudaEventDestroy(t0));
  CK(cudaEventDestroy(t1));
  return v[3];
}
