// The activations' per-element math in float32, shared by the activation kernels (activations_kernels.cu) and the
// FP8 casts that apply an activation on the fly (fp8_kernels.cu), so both write the same values:
//   gelu:      y = 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2/pi)
//   gelu_grad: dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 * 0.044715 x^2), t = tanh(k (x + 0.044715 x^3))
//   swiglu:    y = silu(gate) up = gate / (1 + exp(-gate)) up
//   swiglu's gradients, s = sigmoid(gate): dgate = dy up s (1 + gate (1 - s)), dup = dy gate s
// and a norm's output given its row statistics (norms_kernels.cu's 16-byte path, and the casts of ops.h Fp8Act::Norm):
//   norm_apply: y = (x - mean) rstd gamma + beta, each step rounded once (RMSNorm: mean 0, beta 0)
#pragma once

namespace mcpp::cuda_detail {

constexpr float kGeluK = 0.7978845608028654f;
constexpr float kGeluC = 0.044715f;

__device__ __forceinline__ float gelu(float v) { return 0.5f * v * (1.0f + tanhf(kGeluK * (v + kGeluC * v * v * v))); }
__device__ __forceinline__ float gelu_grad(float v) {
  const float t = tanhf(kGeluK * (v + kGeluC * v * v * v));
  return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluC * v * v);
}

__device__ __forceinline__ float swiglu(float gate, float up) { return gate / (1.0f + expf(-gate)) * up; }
// The gradients take s = swiglu_sigmoid(gate), computed once by a caller that needs both.
__device__ __forceinline__ float swiglu_sigmoid(float gate) { return 1.0f / (1.0f + expf(-gate)); }
__device__ __forceinline__ float swiglu_dgate(float dy, float gate, float up, float s) {
  return dy * up * s * (1.0f + gate * (1.0f - s));
}
__device__ __forceinline__ float swiglu_dup(float dy, float gate, float s) { return dy * gate * s; }

__device__ __forceinline__ float norm_apply(float x, float mean, float rstd, float gamma, float beta) {
  return __fmaf_rn(__fmul_rn(__fsub_rn(x, mean), rstd), gamma, beta);
}

}  // namespace mcpp::cuda_detail
