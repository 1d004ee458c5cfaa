// Device code for elementwise.cpp and the linear bias gradient (gemm.cpp): flat grid-stride kernels.
//   add:             out[i] = a[i] + b[i]
//   axpby_inplace:   y[i] = alpha * y[i] + beta * x[i]   (beta == 0 never reads x)
//   cast:            out[i] = in[i] (rounded to out's dtype)
//   column_sum_acc:  db[c] += sum_r dy[r, c], deterministic (fixed order, no atomics), two kernels:
//                    (1) partial[p, c] = the sum of row chunk p (kColChunk rows) of column c. Vector path
//                    (out % 8 == 0, 16-byte aligned): a 32x8 block covers 256 columns (a warp reads 512
//                    contiguous bytes of a row, 8 columns per thread in fp32 registers) and its 8 row
//                    lanes stride the chunk, 4 rows in flight each; scalar path: 32 columns per block. The
//                    8 row lanes are added in order through shared memory. (2) db[c] += the P partials of
//                    column c in a fixed order (32 lanes, then the lanes in order). partial: fp32 scratch
//                    [column_sum_parts(n), out].
#include "mcpp/kernels/cuda/device_utils.cuh"

namespace mcpp::cuda_detail {
namespace {
constexpr int kThreads = 256;

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

constexpr int64_t kColChunk = 128;  // rows per partial of column_sum_acc

__global__ void column_partial_kernel(float* partial, FIn dy, int64_t n, int64_t out) {
  __shared__ float part[8][33];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kColChunk, r1 = min(n, r0 + kColChunk);
  float acc = 0.0f;
  if (col < out)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) acc += dy[r * out + col];
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < out) {
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) sum += part[i][threadIdx.x];
    partial[blockIdx.y * out + col] = sum;
  }
}

__global__ void column_partial_vec_kernel(float* partial, FIn dy, int64_t n, int64_t out) {
  __shared__ float part[8][32][9];  // [row lane][thread][8 columns] (+1 against bank conflicts)
  const int64_t vecs = out / 8, v = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;  // 8-column group
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kColChunk, r1 = min(n, r0 + kColChunk);
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (v < vecs) {
    int64_t r = r0 + threadIdx.y;
    for (; r + 24 < r1; r += 32) {  // 4 rows in flight
      float c[4][8];
#pragma unroll
      for (int u = 0; u < 4; ++u) load8(dy, (r + 8 * u) * vecs + v, c[u]);
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] += c[u][e];
    }
    for (; r < r1; r += 8) {
      float c[8];
      load8(dy, r * vecs + v, c);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] += c[e];
    }
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) part[threadIdx.y][threadIdx.x][e] = acc[e];
  __syncthreads();
  // 256 threads write the block's 256 columns: thread t sums column group t / 8, element t % 8
  const int t = threadIdx.y * 32 + threadIdx.x, g = t / 8, e = t % 8;
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * 32 + g) * 8 + e;
  if (col < out) {
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) sum += part[i][g][e];
    partial[blockIdx.y * out + col] = sum;
  }
}

// Block (32, 32): 32 columns of target blockIdx.y; lane y adds partials y, y + 32, ... in order, then lane 0
// adds the 32 lanes in order (a fixed order for a given parts count).
__global__ void column_reduce_acc_kernel(ColumnReduceTargets t, const float* partial, int64_t parts, int64_t cols) {
  __shared__ float lane[32][33];
  float* acc = t.acc[blockIdx.y];
  if (!acc) return;  // the whole block
  const float* part = partial + static_cast<int64_t>(blockIdx.y) * parts * cols;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float sum = 0.0f;
  if (c < cols) {
#pragma unroll 4
    for (int64_t p = threadIdx.y; p < parts; p += 32) sum += part[p * cols + c];
  }
  lane[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; ++i) total += lane[i][threadIdx.x];
    acc[c] += total;
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
int64_t column_sum_parts(int64_t n) { return (n + kColChunk - 1) / kColChunk; }

void launch_column_sum_acc(float* db, FIn dy, int64_t n, int64_t out, float* partial, cudaStream_t s) {
  if (n <= 0 || out <= 0) return;
  const int64_t parts = column_sum_parts(n);
  if (out % 8 == 0 && vec8_ok(n * out, {dy.p})) {
    const dim3 grid(static_cast<unsigned>((out / 8 + 31) / 32), static_cast<unsigned>(parts));
    column_partial_vec_kernel<<<grid, dim3(32, 8), 0, s>>>(partial, dy, n, out);
  } else {
    const dim3 grid(static_cast<unsigned>((out + 31) / 32), static_cast<unsigned>(parts));
    column_partial_kernel<<<grid, dim3(32, 8), 0, s>>>(partial, dy, n, out);
  }
  MCPP_CUDA_LAUNCH_CHECK();
  launch_column_reduce_acc(ColumnReduceTargets{{db, nullptr, nullptr, nullptr}}, 1, partial, parts, out, s);
}

void launch_column_reduce_acc(const ColumnReduceTargets& t, int targets, const float* partial, int64_t parts,
                              int64_t cols, cudaStream_t s) {
  if (parts <= 0 || cols <= 0 || targets <= 0) return;
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>(targets));
  column_reduce_acc_kernel<<<grid, dim3(32, 32), 0, s>>>(t, partial, parts, cols);
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
