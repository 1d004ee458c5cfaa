// Device code for elementwise.cpp and the linear bias gradient (gemm.cpp): flat grid-stride kernels.
//   add:             out[i] = a[i] + b[i]
//   axpby_inplace:   y[i] = alpha * y[i] + beta * x[i]   (beta == 0 never reads x)
//   cast:            out[i] = in[i] (rounded to out's dtype)
//   column_sum_acc:  db[c] += sum_r dy[r, c]. Grid (out/32 column strips) x (row chunks of kRows): a 32x8
//                    block sums its strip over its chunk with coalesced row reads, reduces the 8 row lanes
//                    in shared memory and adds one partial per column with atomicAdd (n / kRows atomics per
//                    column; chunk order is not fixed, so the last bits may differ between runs).
#include "mcpp/kernels/cuda/device_utils.cuh"

namespace mcpp::cuda_detail {
namespace {
constexpr int kThreads = 256;
constexpr int kRows = 512;

__global__ void add_kernel(FOut out, FIn a, FIn b, int64_t n) {
  MCPP_GRID_STRIDE(i, n) out.set(i, a[i] + b[i]);
}
__global__ void axpby_inplace_kernel(FOut y, FIn x, float alpha, float beta, int64_t n) {
  MCPP_GRID_STRIDE(i, n) y.set(i, alpha * y.get(i) + (beta != 0.0f ? beta * x[i] : 0.0f));
}
__global__ void cast_kernel(FOut out, FIn in, int64_t n) {
  MCPP_GRID_STRIDE(i, n) out.set(i, in[i]);
}

// 8-wide versions (vec8_ok: n % 8 == 0, 16-byte aligned): out/y may alias an input element for element.
__global__ void add_vec_kernel(FOut out, FIn a, FIn b, int64_t n8) {
  MCPP_GRID_STRIDE(j, n8) {
    float x[8], y[8];
    load8(a, j, x);
    load8(b, j, y);
#pragma unroll
    for (int k = 0; k < 8; ++k) x[k] += y[k];
    store8(out, j, x);
  }
}
__global__ void axpby_vec_kernel(FOut y, FIn x, float alpha, float beta, int64_t n8) {
  MCPP_GRID_STRIDE(j, n8) {
    float a[8], b[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    load8(FIn{y.p, y.kind}, j, a);
    if (beta != 0.0f) load8(x, j, b);
#pragma unroll
    for (int k = 0; k < 8; ++k) a[k] = alpha * a[k] + (beta != 0.0f ? beta * b[k] : 0.0f);
    store8(y, j, a);
  }
}
__global__ void cast_vec_kernel(FOut out, FIn in, int64_t n8) {
  MCPP_GRID_STRIDE(j, n8) {
    float v[8];
    load8(in, j, v);
    store8(out, j, v);
  }
}
// y[n, m] += bias[m] with m % 8 == 0: word j of y takes bias word j % (m / 8).
__global__ void bias_add_vec_kernel(FOut y, FIn bias, int64_t n8, int64_t m8) {
  MCPP_GRID_STRIDE(j, n8) {
    float v[8], b[8];
    load8(FIn{y.p, y.kind}, j, v);
    load8(bias, j % m8, b);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] += b[k];
    store8(y, j, v);
  }
}

__global__ void column_sum_acc_kernel(float* db, FIn dy, int64_t n, int64_t out) {
  __shared__ float part[8][33];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRows;
  const int64_t r1 = min(n, r0 + kRows);
  float acc = 0.0f;
  if (col < out)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) acc += dy[r * out + col];
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < out) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) s += part[i][threadIdx.x];
    atomicAdd(db + col, s);
  }
}
}  // namespace

__global__ void bias_add_kernel(FOut y, FIn bias, int64_t n, int64_t m) {
  MCPP_GRID_STRIDE(i, n * m) { y.set(i, y.get(i) + bias[i % m]); }
}
void launch_bias_add_inplace(FOut y, FIn bias, int64_t n, int64_t m, cudaStream_t s) {
  if (n * m <= 0) return;
  if (m % 8 == 0 && vec8_ok(n * m, {y.p, bias.p})) {
    bias_add_vec_kernel<<<grid_for(n * m / 8, kThreads), kThreads, 0, s>>>(y, bias, n * m / 8, m / 8);
    MCPP_CUDA_LAUNCH_CHECK();
    return;
  }
  bias_add_kernel<<<grid_for(n * m, kThreads), kThreads, 0, s>>>(y, bias, n, m);
  MCPP_CUDA_LAUNCH_CHECK();
}
void launch_add(FOut out, FIn a, FIn b, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  if (vec8_ok(n, {out.p, a.p, b.p})) {
    add_vec_kernel<<<grid_for(n / 8, kThreads), kThreads, 0, s>>>(out, a, b, n / 8);
    MCPP_CUDA_LAUNCH_CHECK();
    return;
  }
  add_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(out, a, b, n);
  MCPP_CUDA_LAUNCH_CHECK();
}
void launch_axpby_inplace(FOut y, FIn x, float alpha, float beta, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  if (vec8_ok(n, {y.p, x.p})) {
    axpby_vec_kernel<<<grid_for(n / 8, kThreads), kThreads, 0, s>>>(y, x, alpha, beta, n / 8);
    MCPP_CUDA_LAUNCH_CHECK();
    return;
  }
  axpby_inplace_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(y, x, alpha, beta, n);
  MCPP_CUDA_LAUNCH_CHECK();
}
void launch_cast(FOut out, FIn in, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  if (vec8_ok(n, {out.p, in.p})) {
    cast_vec_kernel<<<grid_for(n / 8, kThreads), kThreads, 0, s>>>(out, in, n / 8);
    MCPP_CUDA_LAUNCH_CHECK();
    return;
  }
  cast_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(out, in, n);
  MCPP_CUDA_LAUNCH_CHECK();
}
void launch_column_sum_acc(float* db, FIn dy, int64_t n, int64_t out, cudaStream_t s) {
  if (n <= 0 || out <= 0) return;
  const dim3 grid(static_cast<unsigned>((out + 31) / 32), static_cast<unsigned>((n + kRows - 1) / kRows));
  column_sum_acc_kernel<<<grid, dim3(32, 8), 0, s>>>(db, dy, n, out);
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
