// Device code for optimizer.cpp.
//   adamw: elementwise, the operation order of kernels/cpu/adamw.cpp (torch.optim.AdamW) in float32 with
//          the scalar coefficients precomputed on the host in double; optional model copy written (f32/bf16).
//          Every operation is an explicitly rounded intrinsic (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn:
//          no FMA contraction), so results are bit-identical to the CPU backend (built -ffp-contract=off)
//          and between adamw_step and adamw_multi_step.
//   adamw_multi: Apex-style multi-tensor apply: one block per (tensor, 64K-element chunk) from a table in
//          the kernel argument; float4 loads/stores (and 4-wide bf16/f16 model stores) when aligned.
//   sum_of_squares: deterministic two-stage reduction in float64: kReduceBlocks blocks each sum a fixed
//          grid-stride subset (float4 loads for aligned float32, e.g. the fp32 grad buffer), then one block
//          adds the partials in a fixed tree order.
//   has_non_finite: any element with all exponent bits set (NaN / inf) sets *flag = 1.
#include "mcpp/kernels/cuda/device_utils.cuh"

namespace mcpp::cuda_detail {
namespace {
constexpr int kThreads = 256;

// One element: p, m, v updated in place (the CPU order, each operation rounded once).
__device__ __forceinline__ void adamw_elem(float& p, float& m, float& v, float g, float decay, const AdamWCoeffs& c) {
  g = __fmul_rn(g, c.grad_scale);  // the clip coefficient (exact for 1)
  p = __fmul_rn(p, decay);
  m = __fadd_rn(__fmul_rn(m, c.beta1), __fmul_rn(g, c.one_minus_b1));
  v = __fadd_rn(__fmul_rn(v, c.beta2), __fmul_rn(__fmul_rn(g, g), c.one_minus_b2));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), c.bc2_sqrt), c.eps);
  p = __fsub_rn(p, __fmul_rn(c.step_size, __fdiv_rn(m, denom)));
}

__global__ void adamw_kernel(float* param, float* m, float* v, const float* grad, FOut model, AdamWCoeffs c,
                             int64_t n) {
  MCPP_GRID_STRIDE(i, n) {
    float pi = param[i], mi = m[i], vi = v[i];
    adamw_elem(pi, mi, vi, grad[i], c.decay, c);
    param[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (model.p) model.set(i, pi);
  }
}

__global__ void adamw_multi_kernel(const __grid_constant__ AdamWMultiArgs a, const AdamWCoeffs c) {
  const AdamWTensorArgs& t = a.t[a.chunk_tensor[blockIdx.x]];
  const int64_t begin = static_cast<int64_t>(a.chunk_index[blockIdx.x]) * kAdamChunk;
  const int64_t end = min(t.n, begin + kAdamChunk);
  const FOut model{t.model, t.model_kind};
  int64_t i = begin + 4 * static_cast<int64_t>(threadIdx.x);
  if (t.vec4) {
    for (; i + 3 < end; i += 4 * static_cast<int64_t>(blockDim.x)) {
      float4 p = *reinterpret_cast<const float4*>(t.p + i), m = *reinterpret_cast<const float4*>(t.m + i);
      float4 v = *reinterpret_cast<const float4*>(t.v + i);
      const float4 g = *reinterpret_cast<const float4*>(t.g + i);
      adamw_elem(p.x, m.x, v.x, g.x, t.decay, c);
      adamw_elem(p.y, m.y, v.y, g.y, t.decay, c);
      adamw_elem(p.z, m.z, v.z, g.z, t.decay, c);
      adamw_elem(p.w, m.w, v.w, g.w, t.decay, c);
      *reinterpret_cast<float4*>(t.p + i) = p;
      *reinterpret_cast<float4*>(t.m + i) = m;
      *reinterpret_cast<float4*>(t.v + i) = v;
      if (!t.model) continue;
      if (t.model_kind == kF32) {
        *reinterpret_cast<float4*>(static_cast<float*>(t.model) + i) = p;
      } else {
        uint32_t u[2];
        if (t.model_kind == kBF16) {
          const __nv_bfloat162 lo = __floats2bfloat162_rn(p.x, p.y), hi = __floats2bfloat162_rn(p.z, p.w);
          u[0] = *reinterpret_cast<const uint32_t*>(&lo), u[1] = *reinterpret_cast<const uint32_t*>(&hi);
        } else {
          const __half2 lo = __floats2half2_rn(p.x, p.y), hi = __floats2half2_rn(p.z, p.w);
          u[0] = *reinterpret_cast<const uint32_t*>(&lo), u[1] = *reinterpret_cast<const uint32_t*>(&hi);
        }
        *reinterpret_cast<uint2*>(static_cast<uint16_t*>(t.model) + i) = make_uint2(u[0], u[1]);
      }
    }
    // i >= end - 3 here: the chunk's tail (< 4 elements, the tensor's last chunk) goes element-wise
    i = begin + ((end - begin) & ~int64_t(3)) + threadIdx.x;
    if (threadIdx.x >= 4) return;
  } else {
    i = begin + threadIdx.x;
  }
  const int64_t step = t.vec4 ? 4 : blockDim.x;
  for (; i < end; i += step) {
    float pi = t.p[i], mi = t.m[i], vi = t.v[i];
    adamw_elem(pi, mi, vi, t.g[i], t.decay, c);
    t.p[i] = pi;
    t.m[i] = mi;
    t.v[i] = vi;
    if (t.model) model.set(i, pi);
  }
}

__global__ void sum_sq_partial_kernel(double* partial, FIn x, int64_t n) {
  __shared__ double scratch[33];
  double s = 0.0;
  MCPP_GRID_STRIDE(i, n) {
    const double v = x[i];
    s += v * v;
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// float32 x, 16-byte aligned: 4 float4 loads in flight per thread, each element squared and added in
// float64 (a fixed order for a given grid: deterministic), the n % 4 tail by the first threads.
__global__ void sum_sq_partial_f32x4_kernel(double* partial, const float* x, int64_t n) {
  __shared__ double scratch[33];
  const float4* x4 = reinterpret_cast<const float4*>(x);
  const int64_t n4 = n / 4, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  auto sq4 = [](const float4 v) {
    return static_cast<double>(v.x) * v.x + static_cast<double>(v.y) * v.y + static_cast<double>(v.z) * v.z +
           static_cast<double>(v.w) * v.w;
  };
  double s = 0.0;
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n4; i += 4 * stride) {
    const float4 a = x4[i], b = x4[i + stride], c = x4[i + 2 * stride], d = x4[i + 3 * stride];
    s += sq4(a) + sq4(b) + sq4(c) + sq4(d);
  }
  for (; i < n4; i += stride) s += sq4(x4[i]);
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t < n - 4 * n4) {
    const double v = x[4 * n4 + t];
    s += v * v;
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_partials_kernel(double* result, const double* partial, int count) {
  __shared__ double scratch[33];
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) *result = s;
}

__global__ void non_finite_kernel(int* flag, FIn x, int64_t n) {
  MCPP_GRID_STRIDE(i, n) {
    if (!isfinite(x[i])) *flag = 1;
  }
}
}  // namespace

void launch_adamw(float* param, float* m, float* v, const float* grad, FOut model, const AdamWCoeffs& c, int64_t n,
                  cudaStream_t s) {
  if (n <= 0) return;
  adamw_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(param, m, v, grad, model, c, n);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_adamw_multi(const AdamWMultiArgs& a, const AdamWCoeffs& c, cudaStream_t s) {
  if (a.blocks <= 0) return;
  adamw_multi_kernel<<<static_cast<unsigned>(a.blocks), kThreads, 0, s>>>(a, c);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_sum_of_squares(double* result, double* partial, FIn x, int64_t n, cudaStream_t s) {
  if (x.kind == kF32 && reinterpret_cast<uintptr_t>(x.p) % 16 == 0)
    sum_sq_partial_f32x4_kernel<<<kReduceBlocks, kThreads, 0, s>>>(partial, static_cast<const float*>(x.p), n);
  else
    sum_sq_partial_kernel<<<kReduceBlocks, kThreads, 0, s>>>(partial, x, n);
  MCPP_CUDA_LAUNCH_CHECK();
  sum_partials_kernel<<<1, 1024, 0, s>>>(result, partial, kReduceBlocks);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_has_non_finite(int* flag, FIn x, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  non_finite_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(flag, x, n);
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
