// Kernel interface (DESIGN.md decision 4): each op declared once in ops.inc; this header instantiates
// the list three times. Callers use mcpp::ops::<op>, which dispatches on the output tensor's device to
// mcpp::ops::cpu::<op> (kernels/cpu, the reference) or mcpp::ops::cuda::<op> (kernels/cuda, or the
// stub in a build without CUDA).
#pragma once
#include <cstdint>
#include <vector>

#include "mcpp/core/rng.h"
#include "mcpp/core/stream.h"
#include "mcpp/core/tensor.h"

namespace mcpp::ops {

struct GemmOptions {
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  float beta = 0.0f;
};

struct AttentionOptions {
  float softmax_scale = 1.0f;  // usually 1/sqrt(d)
  bool causal = true;
  // CUDA: false lets bf16 calls run cuDNN's fused attention where it has an engine (faster; its backward
  // is not bit-identical run to run); true keeps the deterministic mcpp kernels. CPU: always deterministic.
  bool deterministic = false;
};

struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;  // 1-based, for bias correction
};

// One parameter (or shard piece) of adamw_multi_step: handles sharing storage with the caller's tensors.
// param_model undefined = no model copy; weight_decay replaces opt.weight_decay for this entry.
struct AdamWTensors {
  Tensor param, exp_avg, exp_avg_sq, grad, param_model;
  float weight_decay = 0.0f;
};

#define MCPP_OP_UNPAREN(...) __VA_ARGS__
#define MCPP_OP(ret, name, params) ret name(MCPP_OP_UNPAREN params, Stream stream = {});
#include "mcpp/kernels/ops.inc"
#undef MCPP_OP
#define MCPP_OP(ret, name, params) ret name(MCPP_OP_UNPAREN params, Stream stream);
namespace cpu {
#include "mcpp/kernels/ops.inc"
}  // namespace cpu
namespace cuda {
#include "mcpp/kernels/ops.inc"
}  // namespace cuda
#undef MCPP_OP

}  // namespace mcpp::ops
