// grouped_probe: the MoE expert GEMMs at GPT-2 124M shapes (h 768, ffn 3072, 8 experts, top-2 of B16 x T1024 =
// 32768 routed rows) three ways: one cuBLAS GEMM per expert, cublasGemmGroupedBatchedEx (one launch), and one
// dense GEMM over all rows (the ideal: same FLOPs, one shape). Balanced (4096 rows each) and skewed row counts.
// fc1 fwd y[r,3072] = x[r,768] W1^T; fc2 fwd y[r,768] = a[r,3072] W2^T; fc1 wgrad dW1[3072,768] += dy^T x (fp32).
// build: nvcc -O3 -arch=sm_90 -o grouped_probe grouped_probe.cu -lcublas
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

#define CK(x) do { auto e_ = (x); if (e_ != 0) { std::printf("error %d at %s:%d\n", (int)e_, __FILE__, __LINE__); std::exit(1); } } while (0)

__global__ void fill_bf16(__nv_bfloat16* x, long n, float scale) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
    x[i] = __float2bfloat16(scale * __sinf(0.37f * (float)(i % 99991) + 1.3f));
}

int main() {
  const int E = 8, h = 768, f = 3072, total = 32768;
  cublasHandle_t blas; CK(cublasCreate(&blas));
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); CK(cublasSetStream(blas, s));
  __nv_bfloat16 *x, *a, *w1, *w2, *y1, *y2, *dy;
  float* dw1;
  CK(cudaMalloc(&x, (long)total * h * 2)); CK(cudaMalloc(&a, (long)total * f * 2));
  CK(cudaMalloc(&w1, (long)E * f * h * 2)); CK(cudaMalloc(&w2, (long)E * f * h * 2));
  CK(cudaMalloc(&y1, (long)total * f * 2)); CK(cudaMalloc(&y2, (long)total * h * 2));
  CK(cudaMalloc(&dy, (long)total * f * 2)); CK(cudaMalloc(&dw1, (long)E * f * h * 4));
  fill_bf16<<<1024, 256>>>(x, (long)total * h, 1); fill_bf16<<<1024, 256>>>(a, (long)total * f, 1);
  fill_bf16<<<1024, 256>>>(w1, (long)E * f * h, 0.05f); fill_bf16<<<1024, 256>>>(w2, (long)E * f * h, 0.05f);
  fill_bf16<<<1024, 256>>>(dy, (long)total * f, 0.01f);
  CK(cudaMemset(dw1, 0, (long)E * f * h * 4));
  CK(cudaDeviceSynchronize());
  const float one = 1, zero = 0;
  cudaEvent_t t0, t1; CK(cudaEventCreate(&t0)); CK(cudaEventCreate(&t1));
  auto time_us = [&](const std::function<void()>& body) {
    for (int i = 0; i < 5; ++i) body();
    std::vector<float> v;
    for (int r = 0; r < 9; ++r) {
      CK(cudaEventRecord(t0, s));
      for (int i = 0; i < 20; ++i) body();
      CK(cudaEventRecord(t1, s)); CK(cudaEventSynchronize(t1));
      float ms; CK(cudaEventElapsedTime(&ms, t0, t1)); v.push_back(ms * 1000 / 20);
    }
    std::sort(v.begin(), v.end());
    return v[4];
  };
  // Device pointer arrays for the grouped call (rebuilt per row split).
  void** dptr; CK(cudaMalloc(&dptr, 3 * E * sizeof(void*)));
  for (int skew = 0; skew < 2; ++skew) {
    std::vector<int> rows(E);
    for (int e = 0; e < E; ++e) rows[e] = skew ? (e % 2 ? 2048 + 512 * (e / 2) : 6144 - 512 * (e / 2)) : total / E;
    int sum = 0; for (int r : rows) sum += r;
    std::vector<long> off(E); long o = 0; for (int e = 0; e < E; ++e) { off[e] = o; o += rows[e]; }
    std::printf("rows per expert (%s, total %d):", skew ? "skewed" : "balanced", sum);
    for (int r : rows) std::printf(" %d", r);
    std::printf("\n");
    // column-major view: row-major y[r,n] = x[r,k] W[n,k]^T  <=>  y^T[n,r] = W[n,k] x^T  (cuBLAS: op(A)=W^T? )
    // cuBLAS (col-major) C[n, r] = A^T[n,k] * B[k, r] with A = W stored [n,k] row-major = col-major [k,n] -> OP_T.
    struct Case { const char* name; int n, k; bool wgrad; };
    for (Case c : {Case{"fc1 fwd", f, h, false}, Case{"fc2 fwd", h, f, false}, Case{"fc1 wgrad (fp32 +=)", f, h, true}}) {
      const __nv_bfloat16* in = c.k == h ? x : a;
      const __nv_bfloat16* wt = c.k == h ? w1 : w2;
      __nv_bfloat16* outp = c.n == f ? y1 : y2;
      auto seq = [&] {
        for (int e = 0; e < E; ++e) {
          if (!c.wgrad) {
            cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, c.n, rows[e], c.k, &one, wt + (long)e * f * h, CUDA_R_16BF, c.k,
                         in + off[e] * c.k, CUDA_R_16BF, c.k, &zero, outp + off[e] * c.n, CUDA_R_16BF, c.n,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
          } else {  // row-major dW[f,h] += dy[r,f]^T x[r,h]  <=> col-major dW^T[h,f] = x^T[h,r] dy[r,f]
            cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_T, h, f, rows[e], &one, x + off[e] * h, CUDA_R_16BF, h,
                         dy + off[e] * f, CUDA_R_16BF, f, &one, dw1 + (long)e * f * h, CUDA_R_32F, h,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
          }
        }
      };
      // grouped: one group per expert (group_size 1 each), pointer arrays on the device
      std::vector<void*> ptrs(3 * E);
      std::vector<cublasOperation_t> ta(E), tb(E);
      std::vector<int> M(E), N(E), K(E), lda(E), ldb(E), ldc(E), gs(E, 1);
      std::vector<float> al(E, 1.0f), be(E, c.wgrad ? 1.0f : 0.0f);
      for (int e = 0; e < E; ++e) {
        if (!c.wgrad) {
          ta[e] = CUBLAS_OP_T; tb[e] = CUBLAS_OP_N; M[e] = c.n; N[e] = rows[e]; K[e] = c.k;
          lda[e] = c.k; ldb[e] = c.k; ldc[e] = c.n;
          ptrs[e] = (void*)(wt + (long)e * f * h); ptrs[E + e] = (void*)(in + off[e] * c.k);
          ptrs[2 * E + e] = (void*)(outp + off[e] * c.n);
        } else {
          ta[e] = CUBLAS_OP_N; tb[e] = CUBLAS_OP_T; M[e] = h; N[e] = f; K[e] = rows[e];
          lda[e] = h; ldb[e] = f; ldc[e] = h;
          ptrs[e] = (void*)(x + off[e] * h); ptrs[E + e] = (void*)(dy + off[e] * f);
          ptrs[2 * E + e] = (void*)(dw1 + (long)e * f * h);
        }
      }
      CK(cudaMemcpy(dptr, ptrs.data(), 3 * E * sizeof(void*), cudaMemcpyHostToDevice));
      auto grouped = [&] {
        cublasStatus_t st = cublasGemmGroupedBatchedEx(
            blas, ta.data(), tb.data(), M.data(), N.data(), K.data(), al.data(), (const void* const*)dptr, CUDA_R_16BF,
            lda.data(), (const void* const*)(dptr + E), CUDA_R_16BF, ldb.data(), be.data(), (void* const*)(dptr + 2 * E),
            c.wgrad ? CUDA_R_32F : CUDA_R_16BF, ldc.data(), E, gs.data(), CUBLAS_COMPUTE_32F);
        if (st != CUBLAS_STATUS_SUCCESS) { std::printf("grouped: status %d\n", (int)st); std::exit(1); }
      };
      auto dense = [&] {  // all rows against expert 0's weight (same FLOPs, one shape)
        if (!c.wgrad)
          cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, c.n, total, c.k, &one, wt, CUDA_R_16BF, c.k, in, CUDA_R_16BF,
                       c.k, &zero, outp, CUDA_R_16BF, c.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        else
          cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_T, h, f, total, &one, x, CUDA_R_16BF, h, dy, CUDA_R_16BF, f, &one,
                       dw1, CUDA_R_32F, h, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      };
      const double tflop = 2.0 * total * f * h / 1e12;
      double ts = time_us(seq), tg = time_us(grouped), td = time_us(dense);
      std::printf("  %-20s per expert %7.1f us (%4.0f TFLOP/s) | grouped %7.1f us (%4.0f) | one dense GEMM %7.1f us (%4.0f)\n",
                  c.name, ts, tflop / ts * 1e6, tg, tflop / tg * 1e6, td, tflop / td * 1e6);
    }
  }
  return 0;
}
