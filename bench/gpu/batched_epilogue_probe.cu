// batched_epilogue_probe: can a pointer-array batched cuBLASLt GEMM (the padded MoE layer's one call for all experts,
// kernels/cuda/grouped_gemm_lt.cpp) carry the epilogues SequentialMLP's per-expert GEMMs use (gemm.cpp)? At GPT-2 124M
// MoE shapes padded to capacity (8 experts x 4,096 rows, h 768, ffn 3072), each epilogue is asked of the heuristic in
// pointer-array mode, with its vectors as one buffer an expert apart (CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE,
// ..._EPILOGUE_AUX_BATCH_STRIDE), then run and compared with one non-batched call per expert of the same epilogue
// (max |difference| of every output; 0 expected: the same kernels' math), and timed against the batched GEMM without
// the epilogue plus the pass it replaces (the bias add, the GELU, the column sums):
//   fc1 fwd   GELU_AUX_BIAS  act[r, f] = gelu(x W1^T + b1), pre_act (aux) = x W1^T + b1
//   fc2 fwd   BIAS           y[r, h] = act W2^T + b2
//   fc2 dgrad DGELU_BGRAD    dpre[r, f] = (dy W2) * gelu'(pre_act), db1 = column sums of dpre (fp32)
//   fc2 wgrad BGRADB         dW2 = dy^T act, db2 = column sums of dy (fp32)
// build (device): nvcc -O3 -arch=sm_90 -o /tmp/bep bench/gpu/batched_epilogue_probe.cu -lcublasLt
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "probe_util.cuh"

// the pass an epilogue replaces, as a stand-in of its cost: y = f(y) over n elements (read + write)
__global__ void touch_bf16(__nv_bfloat16* y, long n) {
  const long step = static_cast<long>(gridDim.x) * blockDim.x;
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += step)
    y[i] = __float2bfloat16(__bfloat162float(y[i]) * 1.0001f);
}

namespace {
using namespace moe_probe;

// One column-major GEMM per expert D[m, n] = op(A) op(B) (+ epilogue); vec: the bias (input) or bias grad (output)
// buffer, vec_stride elements an expert apart; aux: pre_act, aux_stride elements an expert apart, ld m.
struct Gemm {
  const char* name;
  bool ta, tb;
  int m, n, k, lda, ldb, ldd;
  bool fp32_out, accumulate;
  std::vector<void*> a, b, d;
  cublasLtEpilogue_t epi;
  void* vec;
  cudaDataType vec_t;
  long vec_stride;
  void* aux;
  long aux_stride;
  long pass_elems;  // the elements the replaced pass reads and writes
};

cublasLtMatrixLayout_t layout(cudaDataType t, int rows, int cols, int ld, bool batched) {
  cublasLtMatrixLayout_t l;
  CK(cublasLtMatrixLayoutCreate(&l, t, rows, cols, ld));
  if (batched) {
    int32_t count = E;
    uint32_t bm = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
    CK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    CK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &bm, sizeof(bm)));
  }
  return l;
}

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  std::vector<cublasLtMatmulAlgo_t> algos;
};

// expert < 0: the batched plan; else expert's own call (its vectors at its offsets)
Plan plan(const Gemm& g, bool with_epilogue, int expert) {
  Plan p;
  const bool batched = expert < 0;
  CK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t opa = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  CK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  if (with_epilogue) {
    CK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &g.epi, sizeof(g.epi)));
    const int vb = g.vec_t == CUDA_R_32F ? 4 : 2;
    void* vec = batched ? g.vec : static_cast<char*>(g.vec) + expert * g.vec_stride * vb;
    CK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &g.vec_t, sizeof(g.vec_t)));
    CK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec, sizeof(vec)));
    if (batched)
      CK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &g.vec_stride,
                                        sizeof(g.vec_stride)));
    if (g.aux) {
      void* aux = batched ? g.aux : static_cast<char*>(g.aux) + expert * g.aux_stride * 2;
      const int64_t ld = g.m;
      CK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
      CK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
      if (batched)
        CK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &g.aux_stride,
                                          sizeof(g.aux_stride)));
    }
  }
  const cudaDataType out_t = g.fp32_out ? CUDA_R_32F : CUDA_R_16BF;
  const int ar = g.ta ? g.k : g.m, ac = g.ta ? g.m : g.k, br = g.tb ? g.n : g.k, bc = g.tb ? g.k : g.n;
  p.la = layout(CUDA_R_16BF, ar, ac, g.lda, batched);
  p.lb = layout(CUDA_R_16BF, br, bc, g.ldb, batched);
  p.ld = layout(out_t, g.m, g.n, g.ldd, batched);
  p.algos = candidates(p.desc, p.la, p.lb, p.ld);
  return p;
}

float max_diff(const void* a, const void* b, long n, bool fp32) {
  std::vector<float> ha(static_cast<size_t>(n)), hb(static_cast<size_t>(n));
  if (fp32) {
    CK(cudaMemcpy(ha.data(), a, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb.data(), b, n * 4, cudaMemcpyDeviceToHost));
  } else {
    std::vector<__nv_bfloat16> ta(static_cast<size_t>(n)), tb(static_cast<size_t>(n));
    CK(cudaMemcpy(ta.data(), a, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(tb.data(), b, n * 2, cudaMemcpyDeviceToHost));
    for (long i = 0; i < n; ++i) ha[i] = __bfloat162float(ta[i]), hb[i] = __bfloat162float(tb[i]);
  }
  float m = 0;
  for (long i = 0; i < n; ++i) m = std::max(m, std::fabs(ha[i] - hb[i]));
  return m;
}

void* dev(long bytes) {
  void* p;
  CK(cudaMalloc(&p, bytes));
  CK(cudaMemset(p, 0, bytes));
  return p;
}
}  // namespace

int main() {
  CK(cublasLtCreate(&lt));
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  workspace = dev(kWorkspace);
  const long nx = static_cast<long>(ROWS) * H, na = static_cast<long>(ROWS) * F, nw = static_cast<long>(E) * F * H;
  auto* x = static_cast<__nv_bfloat16*>(dev(nx * 2));
  auto* act = static_cast<__nv_bfloat16*>(dev(na * 2));
  auto* pre = static_cast<__nv_bfloat16*>(dev(na * 2));
  auto* w1 = static_cast<__nv_bfloat16*>(dev(nw * 2));
  auto* w2 = static_cast<__nv_bfloat16*>(dev(nw * 2));
  auto* b1 = static_cast<__nv_bfloat16*>(dev(static_cast<long>(E) * F * 2));
  auto* b2 = static_cast<__nv_bfloat16*>(dev(static_cast<long>(E) * H * 2));
  auto* y2 = static_cast<__nv_bfloat16*>(dev(nx * 2));
  auto* dy2 = static_cast<__nv_bfloat16*>(dev(nx * 2));
  auto* dpre = static_cast<__nv_bfloat16*>(dev(na * 2));
  auto* db1 = static_cast<float*>(dev(static_cast<long>(E) * F * 4));
  auto* db2 = static_cast<float*>(dev(static_cast<long>(E) * H * 4));
  auto* dw2 = static_cast<float*>(dev(nw * 4));
  auto* scratch = static_cast<__nv_bfloat16*>(dev(2 * na * 2));  // the stand-in pass's buffer
  fill_bf16<<<1024, 256>>>(x, nx, 1, 1.3f);
  fill_bf16<<<1024, 256>>>(act, na, 1, 0.2f);
  fill_bf16<<<1024, 256>>>(pre, na, 1, 0.7f);
  fill_bf16<<<1024, 256>>>(w1, nw, 0.05f, 2.1f);
  fill_bf16<<<1024, 256>>>(w2, nw, 0.05f, 0.4f);
  fill_bf16<<<64, 256>>>(b1, static_cast<long>(E) * F, 0.1f, 1.9f);
  fill_bf16<<<64, 256>>>(b2, static_cast<long>(E) * H, 0.1f, 2.9f);
  fill_bf16<<<1024, 256>>>(dy2, nx, 0.01f, 0.9f);
  CK(cudaDeviceSynchronize());
  auto at = [](void* base, long per_expert, int bytes) {
    std::vector<void*> v;
    for (int e = 0; e < E; ++e) v.push_back(static_cast<char*>(base) + e * per_expert * bytes);
    return v;
  };
  const long cf = static_cast<long>(CAP) * F, ch = static_cast<long>(CAP) * H, fh = static_cast<long>(F) * H;
  // column-major views: fwd D[out, r] = W^T(A: [in, out] ld in, T) x^T(B: [in, r] ld in);
  // dgrad D[in, r] = W(A: [in, out] ld in) dy^T(B: [out, r] ld out); wgrad D[in, out] = x^T(A: [in, r]) dy(B, T)
  std::vector<Gemm> cases = {
      {"fc1 fwd GELU_AUX_BIAS", true, false, F, CAP, H, H, H, F, false, false, at(w1, fh, 2), at(x, ch, 2),
       at(act, cf, 2), CUBLASLT_EPILOGUE_GELU_AUX_BIAS, b1, CUDA_R_16BF, F, pre, cf, 2 * na},
      {"fc2 fwd BIAS", true, false, H, CAP, F, F, F, H, false, false, at(w2, fh, 2), at(act, cf, 2), at(y2, ch, 2),
       CUBLASLT_EPILOGUE_BIAS, b2, CUDA_R_16BF, H, nullptr, 0, nx},
      {"fc2 dgrad DGELU_BGRAD", false, false, F, CAP, H, F, H, F, false, false, at(w2, fh, 2), at(dy2, ch, 2),
       at(dpre, cf, 2), CUBLASLT_EPILOGUE_DGELU_BGRAD, db1, CUDA_R_32F, F, pre, cf, 2 * na},
      {"fc2 wgrad BGRADB", false, true, F, H, CAP, F, H, F, true, false, at(act, cf, 2), at(dy2, ch, 2),
       at(dw2, fh, 4), CUBLASLT_EPILOGUE_BGRADB, db2, CUDA_R_32F, H, nullptr, 0, nx / 2},
  };
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, cuBLASLt %zu; %d experts x %d rows, h %d, ffn %d; pointer-array batched GEMMs with epilogues\n",
              prop.name, cublasLtGetVersion(), E, CAP, H, F);
  const float one = 1, zero = 0;
  for (const Gemm& g : cases) {
    Plan fused = plan(g, true, -1), plain = plan(g, false, -1);
    std::printf("  %-22s batched candidates: with the epilogue %zu, without %zu\n", g.name, fused.algos.size(),
                plain.algos.size());
    if (fused.algos.empty() || plain.algos.empty()) continue;
    std::vector<void*> host;
    for (const auto* l : {&g.a, &g.b, &g.d}) host.insert(host.end(), l->begin(), l->end());
    void** ptrs = static_cast<void**>(dev(static_cast<long>(host.size() * sizeof(void*))));
    CK(cudaMemcpy(ptrs, host.data(), host.size() * sizeof(void*), cudaMemcpyHostToDevice));
    // the reference: one call per expert with the same epilogue, into copies of the outputs
    const int ob = g.fp32_out ? 4 : 2, vb = g.vec_t == CUDA_R_32F ? 4 : 2;
    const long d_elems = static_cast<long>(g.m) * g.n * E, vec_elems = g.vec_stride * E;
    const bool vec_out = g.epi == CUBLASLT_EPILOGUE_DGELU_BGRAD || g.epi == CUBLASLT_EPILOGUE_BGRADB;
    const bool aux_out = g.epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    for (int e = 0; e < E; ++e) {
      Plan pe = plan(g, true, e);
      if (pe.algos.empty()) {
        std::printf("    expert %d: no per-expert algorithm\n", e);
        std::exit(1);
      }
      CK(cublasLtMatmul(lt, pe.desc, &one, g.a[e], pe.la, g.b[e], pe.lb, &zero, g.d[e], pe.ld, g.d[e], pe.ld,
                        &pe.algos[0], workspace, kWorkspace, s));
    }
    CK(cudaStreamSynchronize(s));
    void* d_ref = dev(d_elems * ob);
    void* v_ref = dev(vec_elems * vb);
    void* a_ref = dev(g.aux ? static_cast<long>(na) * 2 : 2);
    CK(cudaMemcpy(d_ref, g.d[0], d_elems * ob, cudaMemcpyDeviceToDevice));
    if (vec_out) CK(cudaMemcpy(v_ref, g.vec, vec_elems * vb, cudaMemcpyDeviceToDevice));
    if (aux_out) CK(cudaMemcpy(a_ref, g.aux, na * 2, cudaMemcpyDeviceToDevice));
    CK(cudaMemset(g.d[0], 0, d_elems * ob));
    if (vec_out) CK(cudaMemset(g.vec, 0, vec_elems * vb));
    if (aux_out) CK(cudaMemset(g.aux, 0, na * 2));
    float best_fused = -1, best_plain = -1;
    int ok = 0;
    for (size_t i = 0; i < fused.algos.size(); ++i) {
      auto call = [&] {
        return cublasLtMatmul(lt, fused.desc, &one, ptrs, fused.la, ptrs + E, fused.lb, &zero, ptrs + 2 * E, fused.ld,
                              ptrs + 2 * E, fused.ld, &fused.algos[i], workspace, kWorkspace, s);
      };
      if (call() != CUBLAS_STATUS_SUCCESS) continue;
      CK(cudaStreamSynchronize(s));
      if (i == 0 || ok == 0) {  // the first algorithm that runs: its outputs against the per-expert calls
        std::printf("    max |batched - per expert| (candidate %zu): D %.3g", i,
                    max_diff(g.d[0], d_ref, d_elems, g.fp32_out));
        if (vec_out) std::printf(", bias grad %.3g", max_diff(g.vec, v_ref, vec_elems, true));
        if (aux_out) std::printf(", pre_act %.3g", max_diff(g.aux, a_ref, na, false));
        std::printf("\n");
      }
      ++ok;
      const float us = time_us(s, [&] { CK(call()); });
      if (best_fused < 0 || us < best_fused) best_fused = us;
    }
    for (size_t i = 0; i < plain.algos.size(); ++i) {
      auto call = [&] {
        return cublasLtMatmul(lt, plain.desc, &one, ptrs, plain.la, ptrs + E, plain.lb, &zero, ptrs + 2 * E, plain.ld,
                              ptrs + 2 * E, plain.ld, &plain.algos[i], workspace, kWorkspace, s);
      };
      if (call() != CUBLAS_STATUS_SUCCESS) continue;
      const float us = time_us(s, [&] { CK(call()); });
      if (best_plain < 0 || us < best_plain) best_plain = us;
    }
    const float pass = time_us(s, [&] { touch_bf16<<<1024, 256, 0, s>>>(scratch, g.pass_elems); });
    std::printf("    us, best of the candidates that ran (%d): fused %.1f | plain %.1f + a %ld-element pass %.1f = "
                "%.1f\n", ok, best_fused, best_plain, g.pass_elems, pass, best_plain + pass);
    CK(cudaFree(ptrs));
    CK(cudaFree(d_ref));
    CK(cudaFree(v_ref));
    CK(cudaFree(a_ref));
  }
  return 0;
}
