// batched_probe: the MoE experts' six GEMMs at GPT-2 124M shapes padded to capacity (8 experts x 4,096 rows: top-2
// of B16 x T1024, capacity factor 1.0; h 768, ffn 3072) on cuBLASLt four ways, to choose how a padded layer should
// run them: one call per expert (SequentialMLP today), one strided-batched call (batch 8, every operand at a fixed
// stride), one pointer-array batched call (CUBLASLT_BATCH_MODE_POINTER_ARRAY: each expert's A / B / C / D address from
// a device array, so the experts' parameters need no common stride), and one dense GEMM over all 32,768 rows (the
// same FLOPs in one shape: the ideal). Each way is timed with cuBLASLt's heuristic #0 and with the best of its first
// 8 candidates (our GEMMs autotune that way). Row-major tensors, as the model's:
//   fwd    y[r, out] = x[r, in] W[out, in]^T      dgrad  dx[r, in] = dy[r, out] W[out, in]
//   wgrad  dW[out, in] += dy[r, out]^T x[r, in]   (fp32 accumulation into the main grad, beta 1)
// build (device): nvcc -O3 -arch=sm_90 -o /tmp/batched_probe bench/gpu/batched_probe.cu -lcublasLt
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "probe_util.cuh"

namespace {
using namespace moe_probe;

enum class Mode { PerExpert, Strided, PointerArray, Dense };

// One column-major GEMM D[m, n] = op(A) op(B) (+ C), batch operands described by their per-batch pointers.
struct Gemm {
  bool ta, tb;            // op(A) = A^T, op(B) = B^T
  int m, n, k;            // of one batch entry
  int lda, ldb, ldd;
  bool fp32_out, accumulate;
  std::vector<void*> a, b, d;  // one per expert (size E)
};

cublasLtMatrixLayout_t layout(cudaDataType t, int rows, int cols, int ld, Mode mode, long stride) {
  cublasLtMatrixLayout_t l;
  CK(cublasLtMatrixLayoutCreate(&l, t, rows, cols, ld));
  if (mode == Mode::Strided || mode == Mode::PointerArray) {
    int32_t count = E;
    CK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
  }
  if (mode == Mode::Strided)
    CK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  if (mode == Mode::PointerArray) {
    uint32_t bm = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
    CK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &bm, sizeof(bm)));
  }
  return l;
}

// Times g one way; returns {heuristic #0 us, best us, candidates} (negative: cuBLASLt has no algorithm).
struct Timing {
  float first = -1, best = -1;
  int candidates = 0;
};
Timing run(const Gemm& g, Mode mode) {
  const cudaDataType out_t = g.fp32_out ? CUDA_R_32F : CUDA_R_16BF;
  // Dense: every expert's rows in one call on expert 0's operands; the rows are n (fwd, dgrad) or k (wgrad)
  const int n = mode == Mode::Dense && !g.accumulate ? g.n * E : g.n;
  const int k = mode == Mode::Dense && g.accumulate ? g.k * E : g.k;
  cublasLtMatmulDesc_t desc;
  CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t opa = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  const long sa = static_cast<char*>(g.a[1]) - static_cast<char*>(g.a[0]);
  const long sb = static_cast<char*>(g.b[1]) - static_cast<char*>(g.b[0]);
  const long sd = static_cast<char*>(g.d[1]) - static_cast<char*>(g.d[0]);
  const int ar = g.ta ? k : g.m, ac = g.ta ? g.m : k, br = g.tb ? n : k, bc = g.tb ? k : n;
  cublasLtMatrixLayout_t la = layout(CUDA_R_16BF, ar, ac, g.lda, mode, sa / 2);
  cublasLtMatrixLayout_t lb = layout(CUDA_R_16BF, br, bc, g.ldb, mode, sb / 2);
  cublasLtMatrixLayout_t ld = layout(out_t, g.m, n, g.ldd, mode, sd / (g.fp32_out ? 4 : 2));
  const std::vector<cublasLtMatmulAlgo_t> algos = candidates(desc, la, lb, ld);
  Timing t;
  void** ptrs = nullptr;
  if (mode == Mode::PointerArray) {  // [a | b | d] pointer arrays on the device
    std::vector<void*> host;
    host.insert(host.end(), g.a.begin(), g.a.end());
    host.insert(host.end(), g.b.begin(), g.b.end());
    host.insert(host.end(), g.d.begin(), g.d.end());
    CK(cudaMalloc(&ptrs, host.size() * sizeof(void*)));
    CK(cudaMemcpy(ptrs, host.data(), host.size() * sizeof(void*), cudaMemcpyHostToDevice));
  }
  const float one = 1, beta = g.accumulate ? 1.0f : 0.0f;
  if (!algos.empty()) {
    t.candidates = static_cast<int>(algos.size());
    for (size_t i = 0; i < algos.size(); ++i) {
      auto call = [&] {
        if (mode == Mode::PerExpert) {
          for (int e = 0; e < E; ++e)
            CK(cublasLtMatmul(lt, desc, &one, g.a[e], la, g.b[e], lb, &beta, g.d[e], ld, g.d[e], ld, &algos[i],
                              workspace, kWorkspace, s));
        } else if (mode == Mode::PointerArray) {
          CK(cublasLtMatmul(lt, desc, &one, ptrs, la, ptrs + E, lb, &beta, ptrs + 2 * E, ld, ptrs + 2 * E, ld,
                            &algos[i], workspace, kWorkspace, s));
        } else {
          CK(cublasLtMatmul(lt, desc, &one, g.a[0], la, g.b[0], lb, &beta, g.d[0], ld, g.d[0], ld, &algos[i],
                            workspace, kWorkspace, s));
        }
      };
      const float us = time_us(s, call);
      if (i == 0) t.first = us;
      if (t.best < 0 || us < t.best) t.best = us;
    }
  }
  if (ptrs) CK(cudaFree(ptrs));
  CK(cublasLtMatrixLayoutDestroy(la));
  CK(cublasLtMatrixLayoutDestroy(lb));
  CK(cublasLtMatrixLayoutDestroy(ld));
  CK(cublasLtMatmulDescDestroy(desc));
  return t;
}
}  // namespace

int main() {
  CK(cublasLtCreate(&lt));
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaMalloc(&workspace, kWorkspace));
  __nv_bfloat16 *x, *act, *w1, *w2, *y1, *y2, *dy1, *dy2, *dx, *dact;
  float *dw1, *dw2;
  const long nx = static_cast<long>(ROWS) * H, na = static_cast<long>(ROWS) * F, nw = static_cast<long>(E) * F * H;
  CK(cudaMalloc(&x, nx * 2));
  CK(cudaMalloc(&act, na * 2));
  CK(cudaMalloc(&w1, nw * 2));
  CK(cudaMalloc(&w2, nw * 2));
  CK(cudaMalloc(&y1, na * 2));
  CK(cudaMalloc(&y2, nx * 2));
  CK(cudaMalloc(&dy1, na * 2));
  CK(cudaMalloc(&dy2, nx * 2));
  CK(cudaMalloc(&dx, nx * 2));
  CK(cudaMalloc(&dact, na * 2));
  CK(cudaMalloc(&dw1, nw * 4));
  CK(cudaMalloc(&dw2, nw * 4));
  fill_bf16<<<1024, 256>>>(x, nx, 1);
  fill_bf16<<<1024, 256>>>(act, na, 1);
  fill_bf16<<<1024, 256>>>(w1, nw, 0.05f);
  fill_bf16<<<1024, 256>>>(w2, nw, 0.05f);
  fill_bf16<<<1024, 256>>>(dy1, na, 0.01f);
  fill_bf16<<<1024, 256>>>(dy2, nx, 0.01f);
  CK(cudaMemset(dw1, 0, nw * 4));
  CK(cudaMemset(dw2, 0, nw * 4));
  CK(cudaDeviceSynchronize());
  // per-expert addresses: expert e's rows at e * CAP, its weights at e * F * H
  auto rows_of = [](void* base, int width, int bytes) {
    std::vector<void*> v;
    for (int e = 0; e < E; ++e) v.push_back(static_cast<char*>(base) + static_cast<long>(e) * CAP * width * bytes);
    return v;
  };
  auto weights_of = [](void* base, int bytes) {
    std::vector<void*> v;
    for (int e = 0; e < E; ++e) v.push_back(static_cast<char*>(base) + static_cast<long>(e) * F * H * bytes);
    return v;
  };
  // column-major views (see the top): fwd D[out, r] = W^T(A: [in, out] ld in, T) x^T(B: [in, r] ld in)
  //   dgrad D[in, r] = W(A: [in, out] ld in, N) dy^T(B: [out, r] ld out)
  //   wgrad D[in, out] += x^T(A: [in, r] ld in, N) dy(B: [out, r] ld out, T)
  struct Case {
    const char* name;
    Gemm g;
  };
  std::vector<Case> cases = {
      {"fc1 fwd",
       {true, false, F, CAP, H, H, H, F, false, false, weights_of(w1, 2), rows_of(x, H, 2), rows_of(y1, F, 2)}},
      {"fc2 fwd",
       {true, false, H, CAP, F, F, F, H, false, false, weights_of(w2, 2), rows_of(act, F, 2), rows_of(y2, H, 2)}},
      {"fc2 dgrad", {false, false, F, CAP, H, F, H, F, false, false, weights_of(w2, 2), rows_of(dy2, H, 2),
                     rows_of(dact, F, 2)}},
      {"fc1 dgrad", {false, false, H, CAP, F, H, F, H, false, false, weights_of(w1, 2), rows_of(dy1, F, 2),
                     rows_of(dx, H, 2)}},
      {"fc2 wgrad fp32+=", {false, true, F, H, CAP, F, H, F, true, true, rows_of(act, F, 2), rows_of(dy2, H, 2),
                            weights_of(dw2, 4)}},
      {"fc1 wgrad fp32+=", {false, true, H, F, CAP, H, F, H, true, true, rows_of(x, H, 2), rows_of(dy1, F, 2),
                            weights_of(dw1, 4)}},
  };
  int dev;
  cudaDeviceProp prop;
  CK(cudaGetDevice(&dev));
  CK(cudaGetDeviceProperties(&prop, dev));
  std::printf("%s, cuBLASLt %zu; %d experts x %d rows, h %d, ffn %d; us (TFLOP/s): heuristic #0 / best of <= 8\n",
              prop.name, cublasLtGetVersion(), E, CAP, H, F);
  double total[4][2] = {};
  for (const Case& c : cases) {
    const double tflop = 2.0 * ROWS * F * H / 1e12;
    std::printf("  %-17s", c.name);
    const Mode modes[] = {Mode::PerExpert, Mode::Strided, Mode::PointerArray, Mode::Dense};
    const char* names[] = {"per expert", "strided", "ptr array", "dense"};
    for (int m = 0; m < 4; ++m) {
      const Timing t = run(c.g, modes[m]);
      if (t.first < 0) {
        std::printf(" | %s: none", names[m]);
        continue;
      }
      std::printf(" | %s %6.1f (%3.0f) / %6.1f (%3.0f)", names[m], t.first, tflop / t.first * 1e6, t.best,
                  tflop / t.best * 1e6);
      total[m][0] += t.first;
      total[m][1] += t.best;
    }
    std::printf("\n");
  }
  std::printf("  six GEMMs, one layer's experts: per expert %.0f / %.0f us, strided %.0f / %.0f, "
              "ptr array %.0f / %.0f, dense %.0f / %.0f\n",
              total[0][0], total[0][1], total[1][0], total[1][1], total[2][0], total[2][1], total[3][0], total[3][1]);
  return 0;
}
