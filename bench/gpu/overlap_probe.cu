// overlap_probe: can AdamW's memory traffic hide under the next step's forward GEMMs at 1.3B?
// The GPT 1.3B forward's GEMMs (24 layers x qkv / proj / fc1 / fc2 at B8 x T2048, bf16, cuBLAS) on one stream,
// and an AdamW-shaped kernel (fp32 param, m, v, grad read; param, m, v written; bf16 copy written: 30 B/param)
// over 1.31e9 parameters on another, in 24 pieces: alone, one after the other, and overlapped (layer i's GEMMs
// wait for piece i). Sustained loop (the board at its power cap), median of the rounds.
// build: nvcc -O3 -arch=sm_90 -o overlap_probe overlap_probe.cu -lcublas
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#define CK(x) do { auto e_ = (x); if (e_ != 0) { std::printf("error %d at %s:%d\n", (int)e_, __FILE__, __LINE__); return 1; } } while (0)

__global__ void adam_like(float* p, float* m, float* v, const float* g, __nv_bfloat16* out, long n) {
  long i = (blockIdx.x * (long)blockDim.x + threadIdx.x) * 4;
  long stride = (long)gridDim.x * blockDim.x * 4;
  for (; i + 3 < n; i += stride) {
    float4 pp = *reinterpret_cast<float4*>(p + i), mm = *reinterpret_cast<float4*>(m + i);
    float4 vv = *reinterpret_cast<float4*>(v + i);
    const float4 gg = *reinterpret_cast<const float4*>(g + i);
    float* P = &pp.x; float* M = &mm.x; float* V = &vv.x; const float* G = &gg.x;
    __nv_bfloat16 o[4];
    for (int k = 0; k < 4; ++k) {
      M[k] = 0.9f * M[k] + 0.1f * G[k];
      V[k] = 0.95f * V[k] + 0.05f * G[k] * G[k];
      P[k] = P[k] * (1 - 1e-5f) - 1e-4f * M[k] / (sqrtf(V[k]) + 1e-8f);
      o[k] = __float2bfloat16(P[k]);
    }
    *reinterpret_cast<float4*>(p + i) = pp; *reinterpret_cast<float4*>(m + i) = mm;
    *reinterpret_cast<float4*>(v + i) = vv;
    *reinterpret_cast<uint2*>(out + i) = *reinterpret_cast<uint2*>(o);
  }
}

// Random-looking values (GEMMs on zeros draw far less power: the cap would not bind).
__global__ void fill_bf16(__nv_bfloat16* x, long n, float scale) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
    x[i] = __float2bfloat16(scale * __sinf(0.37f * (float)(i % 99991) + 1.3f));
}
__global__ void fill_f32(float* x, long n, float scale) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
    x[i] = scale * (1.5f + __sinf(0.61f * (float)(i % 99989)));
}

int main() {
  const int L = 24; const long tokens = 16384, h = 2048, f = 8192;
  const long n_params = 1313722368L, piece = ((n_params / L) + 3) / 4 * 4;
  cublasHandle_t blas; CK(cublasCreate(&blas));
  cudaStream_t s1, s2; CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  // GEMM operands (bf16), reused by every layer: x [tokens, f], w [f, f], y [tokens, f].
  __nv_bfloat16 *x, *w, *y;
  CK(cudaMalloc(&x, tokens * f * 2)); CK(cudaMalloc(&w, f * f * 2)); CK(cudaMalloc(&y, tokens * f * 2));
  fill_bf16<<<1024, 256>>>(x, tokens * f, 1.0f); fill_bf16<<<1024, 256>>>(w, f * f, 0.05f);
  float *p, *m, *v, *g; __nv_bfloat16* out;
  const long N = piece * L;
  CK(cudaMalloc(&p, N * 4)); CK(cudaMalloc(&m, N * 4)); CK(cudaMalloc(&v, N * 4)); CK(cudaMalloc(&g, N * 4));
  CK(cudaMalloc(&out, N * 2));
  for (float* q : {p, m, v, g}) fill_f32<<<1024, 256>>>(q, N, q == g ? 1e-3f : 0.1f);
  CK(cudaDeviceSynchronize());
  const float one = 1, zero = 0;
  CK(cublasSetStream(blas, s1));
  auto gemm = [&](long mm, long nn, long kk) {  // row-major y[mm, nn] = x[mm, kk] w[nn, kk]^T
    cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nn, (int)mm, (int)kk, &one, w, CUDA_R_16BF, (int)kk, x,
                 CUDA_R_16BF, (int)kk, &zero, y, CUDA_R_16BF, (int)nn, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  auto layer = [&] { gemm(tokens, 3 * h, h); gemm(tokens, h, h); gemm(tokens, f, h); gemm(tokens, h, f); };
  std::vector<cudaEvent_t> ev(L);
  for (auto& e : ev) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  cudaEvent_t t0, t1; CK(cudaEventCreate(&t0)); CK(cudaEventCreate(&t1));
  auto adam_piece = [&](int i, cudaStream_t s) {
    long o = i * piece;
    adam_like<<<132 * 8, 256, 0, s>>>(p + o, m + o, v + o, g + o, out + o, piece);
  };
  auto time_ms = [&](auto&& body) {
    CK(cudaEventRecord(t0, s1)); body(); CK(cudaEventRecord(t1, s1)); CK(cudaEventSynchronize(t1));
    float ms = 0; CK(cudaEventElapsedTime(&ms, t0, t1)); return (int)(ms * 1000);  // us
  };
  // modes: 0 GEMMs alone, 1 AdamW alone, 2 AdamW then GEMMs (serial), 3 overlapped
  auto run = [&](int mode) {
    if (mode == 1) { for (int i = 0; i < L; ++i) adam_piece(i, s1); return; }
    if (mode == 2) for (int i = 0; i < L; ++i) adam_piece(i, s1);
    if (mode == 3) {
      cudaEventRecord(ev[0], s1); cudaStreamWaitEvent(s2, ev[0], 0);  // s2 starts with s1's round
      for (int i = 0; i < L; ++i) { adam_piece(i, s2); cudaEventRecord(ev[i], s2); }
    }
    for (int i = 0; i < L; ++i) {
      if (mode == 3) cudaStreamWaitEvent(s1, ev[i], 0);
      layer();
    }
  };
  const char* names[] = {"forward GEMMs alone", "AdamW alone", "AdamW then GEMMs", "overlapped"};
  std::vector<std::vector<int>> us(4);
  for (int warm = 0; warm < 30; ++warm) run(warm % 4);  // reach the power cap
  CK(cudaStreamSynchronize(s1)); CK(cudaStreamSynchronize(s2));
  for (int r = 0; r < 15; ++r)
    for (int mode = 0; mode < 4; ++mode) us[mode].push_back(time_ms([&] { run(mode); }));
  for (int mode = 0; mode < 4; ++mode) {
    std::sort(us[mode].begin(), us[mode].end());
    std::printf("%-22s median %.2f ms (min %.2f, max %.2f)\n", names[mode], us[mode][7] / 1e3, us[mode][0] / 1e3,
                us[mode].back() / 1e3);
  }
  std::printf("AdamW pieces %d x %ld params; forward GEMM work %.1f TFLOP\n", L, piece,
              2.0 * tokens * L * (3 * h * h + h * h + 2 * h * f) / 1e12);
  return 0;
}
