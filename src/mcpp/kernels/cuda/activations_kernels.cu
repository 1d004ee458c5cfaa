// Device code for activations.cpp and dropout.cpp (math as the CPU reference, in float32):
//   gelu:   y = gelu(x), dx = dy gelu'(x) (activation_math.cuh)
//   swiglu: x[rows, 2f] = [gate | up]; y = silu(gate) * up;
//           dgate = dy up s (1 + gate (1 - s)), dup = dy silu(gate), s = sigmoid(gate) (activation_math.cuh)
//   dropout: Philox-4x32-10 exactly as core/rng.h — element i uses counter (offset + i/4, 0), word i%4,
//            uniform = (word >> 8) * 2^-24; keep iff uniform >= p. One thread per 4-element group, so
//            one Philox call per 4 elements, and the mask equals the CPU's bit for bit (vec8_ok: 8 elements
//            and two calls per thread, 16-byte loads and stores).
//   random_normal / random_scale: ops.inc's definitions on the same words (random_scale: one thread per
//            4-element group; the factor fma(width, u, lo) and the product rounded as the CPU's).
#include "mcpp/kernels/cuda/activation_math.cuh"
#include "mcpp/kernels/cuda/device_utils.cuh"
#include "mcpp/kernels/cuda/philox.cuh"

namespace mcpp::cuda_detail {
namespace {
constexpr int kThreads = 256;

__global__ void gelu_fwd_kernel(FOut y, FIn x, int64_t n) {
  MCPP_GRID_STRIDE(i, n) y.set(i, gelu(x[i]));
}
__global__ void gelu_bwd_kernel(FOut dx, FIn dy, FIn x, int64_t n) {
  MCPP_GRID_STRIDE(i, n) dx.set(i, dy[i] * gelu_grad(x[i]));
}
// 8 elements per thread with 16-byte accesses (vec8_ok): same math as the scalar kernels above.
__global__ void gelu_fwd_vec_kernel(FOut y, FIn x, int64_t n8) {
  MCPP_GRID_STRIDE(j, n8) {
    float v[8];
    load8(x, j, v);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = gelu(v[k]);
    store8(y, j, v);
  }
}
__global__ void gelu_bwd_vec_kernel(FOut dx, FIn dy, FIn x, int64_t n8) {
  MCPP_GRID_STRIDE(j, n8) {
    float v[8], d[8];
    load8(x, j, v);
    load8(dy, j, d);
#pragma unroll
    for (int k = 0; k < 8; ++k) d[k] *= gelu_grad(v[k]);
    store8(dx, j, d);
  }
}
__global__ void swiglu_fwd_kernel(FOut y, FIn x, int64_t rows, int64_t f) {
  MCPP_GRID_STRIDE(i, rows * f) {
    const int64_t r = i / f, c = i - r * f;
    y.set(i, swiglu(x[r * 2 * f + c], x[r * 2 * f + f + c]));
  }
}
__global__ void swiglu_bwd_kernel(FOut dx, FIn dy, FIn x, int64_t rows, int64_t f) {
  MCPP_GRID_STRIDE(i, rows * f) {
    const int64_t r = i / f, c = i - r * f;
    const float g = x[r * 2 * f + c], u = x[r * 2 * f + f + c], d = dy[i];
    const float sg = swiglu_sigmoid(g);
    dx.set(r * 2 * f + c, swiglu_dgate(d, g, u, sg));
    dx.set(r * 2 * f + f + c, swiglu_dup(d, g, sg));
  }
}

__global__ void dropout_kernel(FOut y, FIn x, float p, float scale, uint64_t seed, uint64_t key_offset,
                               const uint64_t* base, int64_t n) {
  const uint64_t offset = key_offset + (base ? *base : 0);  // base: CUDA-graph-safe keys (core/rng.h)
  const int64_t groups = (n + 3) / 4;
  MCPP_GRID_STRIDE(g, groups) {
    const uint4 r = philox4x32_10(seed, offset + static_cast<uint64_t>(g));
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) {
      const int64_t i = 4 * g + lane;
      if (i < n) {
        y.set(i, philox_uniform(w[lane]) >= p ? x[i] * scale : 0.0f);
      }
    }
  }
}
// 8 elements per thread (counters 2j, 2j + 1) with 16-byte accesses (vec8_ok): the same mask and values.
__global__ void dropout_vec_kernel(FOut y, FIn x, float p, float scale, uint64_t seed, uint64_t key_offset,
                                   const uint64_t* base, int64_t n8) {
  const uint64_t offset = key_offset + (base ? *base : 0);
  MCPP_GRID_STRIDE(j, n8) {
    float v[8];
    load8(x, j, v);
    uint32_t w[8];
    philox_words8(seed, offset, static_cast<uint64_t>(j), w);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = philox_uniform(w[k]) >= p ? v[k] * scale : 0.0f;
    store8(y, j, v);
  }
}
__global__ void random_normal_kernel(FOut out, uint64_t seed, uint64_t key_offset, const uint64_t* base, int64_t n) {
  const uint64_t offset = key_offset + (base ? *base : 0);
  MCPP_GRID_STRIDE(i, n) {
    const uint4 r = philox4x32_10(seed, offset + static_cast<uint64_t>(i) / 2);
    const uint32_t a = i % 2 ? r.z : r.x, b = i % 2 ? r.w : r.y;
    const double u1 = (static_cast<double>(a >> 8) + 0.5) * (1.0 / 16777216.0);
    const double u2 = static_cast<double>(b >> 8) * (1.0 / 16777216.0);
    out.set(i, static_cast<float>(sqrt(-2.0 * log(u1)) * cos(2.0 * 3.141592653589793 * u2)));
  }
}
__global__ void random_scale_kernel(FOut y, FIn x, float lo, float width, uint64_t seed, uint64_t key_offset,
                                    const uint64_t* base, int64_t n) {
  const uint64_t offset = key_offset + (base ? *base : 0);
  MCPP_GRID_STRIDE(g, (n + 3) / 4) {
    const uint4 r = philox4x32_10(seed, offset + static_cast<uint64_t>(g));
    for (int lane = 0; lane < 4 && 4 * g + lane < n; ++lane) {
      const int64_t i = 4 * g + lane;
      y.set(i, __fmul_rn(x[i], __fmaf_rn(width, philox_uniform(philox_word(r, lane)), lo)));
    }
  }
}
}  // namespace

void launch_random_normal(FOut out, uint64_t seed, uint64_t offset, const uint64_t* base, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  random_normal_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(out, seed, offset, base, n);
  MCPP_CUDA_LAUNCH_CHECK();
}
void launch_random_scale(FOut y, FIn x, float lo, float width, uint64_t seed, uint64_t offset, const uint64_t* base,
                         int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  random_scale_kernel<<<grid_for((n + 3) / 4, kThreads), kThreads, 0, s>>>(y, x, lo, width, seed, offset, base, n);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_gelu_fwd(FOut y, FIn x, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  if (vec8_ok(n, {y.p, x.p})) {
    gelu_fwd_vec_kernel<<<grid_for(n / 8, kThreads), kThreads, 0, s>>>(y, x, n / 8);
    MCPP_CUDA_LAUNCH_CHECK();
    return;
  }
  gelu_fwd_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(y, x, n);
  MCPP_CUDA_LAUNCH_CHECK();
}
void launch_gelu_bwd(FOut dx, FIn dy, FIn x, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  if (vec8_ok(n, {dx.p, dy.p, x.p})) {
    gelu_bwd_vec_kernel<<<grid_for(n / 8, kThreads), kThreads, 0, s>>>(dx, dy, x, n / 8);
    MCPP_CUDA_LAUNCH_CHECK();
    return;
  }
  gelu_bwd_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(dx, dy, x, n);
  MCPP_CUDA_LAUNCH_CHECK();
}
void launch_swiglu_fwd(FOut y, FIn x, int64_t rows, int64_t f, cudaStream_t s) {
  if (rows * f <= 0) return;
  swiglu_fwd_kernel<<<grid_for(rows * f, kThreads), kThreads, 0, s>>>(y, x, rows, f);
  MCPP_CUDA_LAUNCH_CHECK();
}
void launch_swiglu_bwd(FOut dx, FIn dy, FIn x, int64_t rows, int64_t f, cudaStream_t s) {
  if (rows * f <= 0) return;
  swiglu_bwd_kernel<<<grid_for(rows * f, kThreads), kThreads, 0, s>>>(dx, dy, x, rows, f);
  MCPP_CUDA_LAUNCH_CHECK();
}
void launch_dropout(FOut y, FIn x, float p, float scale, uint64_t seed, uint64_t offset, const uint64_t* base,
                    int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  if (vec8_ok(n, {y.p, x.p})) {
    dropout_vec_kernel<<<grid_for(n / 8, kThreads), kThreads, 0, s>>>(y, x, p, scale, seed, offset, base, n / 8);
    MCPP_CUDA_LAUNCH_CHECK();
    return;
  }
  dropout_kernel<<<grid_for((n + 3) / 4, kThreads), kThreads, 0, s>>>(y, x, p, scale, seed, offset, base, n);
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
