// CPU AdamW step on a flat fp32 shard, with torch.optim.AdamW's exact order of operations (torch 1.13
// _single_tensor_adamw), so a CPU run matches a PyTorch reference to fp32 rounding:
//   param *= 1 - lr * wd                                   (decoupled weight decay, first)
//   m = b1 * m + (1 - b1) * g;   v = b2 * v + (1 - b2) * g^2
//   bc1 = 1 - b1^step;  bc2 = 1 - b2^step;  step_size = lr / bc1
//   denom = sqrt(v) / sqrt(bc2) + eps;   param -= step_size * m / denom
// Scalar coefficients are computed in double and rounded to float (as torch does with Python scalars);
// elementwise math is float32. param/exp_avg/exp_avg_sq/grad: float32 with one numel (any shape).
// param_model (optional): the model copy, written with the updated param (fp32 copy or bf16/f16 cast).
// Updates in place; elementwise, so results do not depend on the thread count.
// adamw_multi_step: adamw_step on each entry in order, with the entry's weight_decay.
#include <cmath>

#include "mcpp/kernels/cpu/checks.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cpu {
using detail::require_cpu_f32;

void adamw_step(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad, Tensor* param_model,
                const AdamWOptions& opt, Stream) {
  const char* op = "adamw_step";
  require_cpu_f32(op, "param", param);
  require_cpu_f32(op, "exp_avg", exp_avg);
  require_cpu_f32(op, "exp_avg_sq", exp_avg_sq);
  require_cpu_f32(op, "grad", grad);
  const int64_t n = param.numel();
  detail::require_numel(op, "exp_avg", exp_avg, n, "numel of param");
  detail::require_numel(op, "exp_avg_sq", exp_avg_sq, n, "numel of param");
  detail::require_numel(op, "grad", grad, n, "numel of param");
  MCPP_CHECK(opt.step >= 1, "{}: step must be >= 1 (1-based, for bias correction); got {}", op, opt.step);
  MCPP_CHECK(opt.beta1 >= 0.0f && opt.beta1 < 1.0f && opt.beta2 >= 0.0f && opt.beta2 < 1.0f,
             "{}: beta1/beta2 must be in [0, 1); got beta1 = {}, beta2 = {}", op, opt.beta1, opt.beta2);
  MCPP_CHECK(std::isfinite(opt.grad_scale) && opt.grad_scale >= 0.0f,
             "{}: grad_scale must be finite and non-negative; got {}", op, opt.grad_scale);
  MCPP_CHECK(opt.lr >= 0.0f && opt.eps >= 0.0f && opt.weight_decay >= 0.0f,
             "{}: lr, eps and weight_decay must be non-negative; got lr = {}, eps = {}, weight_decay = {}", op,
             opt.lr, opt.eps, opt.weight_decay);
  DType model_dtype = DType::F32;
  if (param_model) {
    MCPP_CHECK(param_model->defined() && param_model->is_cpu(), "{}: param_model must be a CPU tensor; got {}", op,
               param_model->defined() ? param_model->str() : "undefined");
    model_dtype = param_model->dtype();
    MCPP_CHECK(model_dtype == DType::F32 || model_dtype == DType::BF16 || model_dtype == DType::F16,
               "{}: param_model must be float32, bfloat16 or float16; got {}", op, param_model->str());
    detail::require_numel(op, "param_model", *param_model, n, "numel of param");
  }

  const double lr = opt.lr, b1 = opt.beta1, b2 = opt.beta2;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(opt.step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(opt.step));
  const float decay = static_cast<float>(1.0 - lr * opt.weight_decay);
  const float one_minus_b1 = static_cast<float>(1.0 - b1), one_minus_b2 = static_cast<float>(1.0 - b2);
  const float fb1 = opt.beta1, fb2 = opt.beta2, eps = opt.eps;
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float step_size = static_cast<float>(lr / bc1);
  const float grad_scale = opt.grad_scale;

  float* p = param.data<float>();
  float* m = exp_avg.data<float>();
  float* v = exp_avg_sq.data<float>();
  const float* g = grad.data<float>();
  void* out = param_model ? param_model->raw() : nullptr;
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * grad_scale;  // exact for 1
    float pi = p[i] * decay;
    const float mi = m[i] * fb1 + gi * one_minus_b1;
    const float vi = v[i] * fb2 + gi * gi * one_minus_b2;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    pi = pi - step_size * (mi / denom);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (out) {
      if (model_dtype == DType::F32) static_cast<float*>(out)[i] = pi;
      else if (model_dtype == DType::BF16) static_cast<uint16_t*>(out)[i] = f32_to_bf16(pi);
      else static_cast<uint16_t*>(out)[i] = f32_to_f16(pi);
    }
  }
}

}  // namespace mcpp::ops::cpu

namespace mcpp::ops::cpu {

// The per-entry loop over adamw_step (entry weight_decay): the reference the CUDA version must match.
void adamw_multi_step(const std::vector<AdamWTensors>& list, const AdamWOptions& opt, Stream stream) {
  for (const AdamWTensors& e : list) {
    AdamWOptions o = opt;
    o.weight_decay = e.weight_decay;
    Tensor p = e.param, m = e.exp_avg, v = e.exp_avg_sq, model = e.param_model;  // handles, same storage
    ops::cpu::adamw_step(p, m, v, e.grad, model.defined() ? &model : nullptr, o, stream);
  }
}

}  // namespace mcpp::ops::cpu
