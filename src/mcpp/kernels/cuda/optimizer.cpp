// CUDA optimizer ops, optimizer_kernels.cu (semantics of kernels/cpu/adamw.cpp and reductions.cpp):
//   adamw_step / adamw_multi_step (a few launches over (tensor, chunk) tables, launch.h):
//                   torch.optim.AdamW on a flat float32 shard (decoupled weight decay first; bias
//                   correction with opt.step; scalar coefficients in double, rounded to float as torch does);
//                   param_model (float32 / bf16 / f16), when given, receives the updated value.
//   sum_of_squares: sum x^2 in float64, deterministic (fixed two-stage tree); float32 or bf16 x.
//                   Returns to the host: waits for the stream.
//   has_non_finite: any NaN / inf; returns to the host: waits for the stream.
#include <cmath>

#include "mcpp/kernels/cuda/cuda_check.h"
#include "mcpp/core/device_memory.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cuda {
using namespace cuda_detail;

namespace {
// adamw_step's argument checks; returns the model copy's FOut (p == nullptr: none).
FOut check_adamw(const char* op, const Tensor& param, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 const Tensor& grad, Tensor* param_model, const AdamWOptions& opt) {
  require_float(op, "param", param, false);
  require_float(op, "exp_avg", exp_avg, false);
  require_float(op, "exp_avg_sq", exp_avg_sq, false);
  require_float(op, "grad", grad, false);
  const int64_t n = param.numel();
  require_numel(op, "exp_avg", exp_avg, n, "numel of param");
  require_numel(op, "exp_avg_sq", exp_avg_sq, n, "numel of param");
  require_numel(op, "grad", grad, n, "numel of param");
  MCPP_CHECK(opt.step >= 1, "{}: step must be >= 1 (1-based, for bias correction); got {}", op, opt.step);
  MCPP_CHECK(opt.beta1 >= 0.0f && opt.beta1 < 1.0f && opt.beta2 >= 0.0f && opt.beta2 < 1.0f,
             "{}: beta1/beta2 must be in [0, 1); got beta1 = {}, beta2 = {}", op, opt.beta1, opt.beta2);
  MCPP_CHECK(std::isfinite(opt.grad_scale) && opt.grad_scale >= 0.0f,
             "{}: grad_scale must be finite and non-negative; got {}", op, opt.grad_scale);
  MCPP_CHECK(opt.lr >= 0.0f && opt.eps >= 0.0f && opt.weight_decay >= 0.0f,
             "{}: lr, eps and weight_decay must be non-negative; got lr = {}, eps = {}, weight_decay = {}", op, opt.lr,
             opt.eps, opt.weight_decay);
  FOut model{nullptr, kF32};
  if (param_model) {
    model = fout_of(op, "param_model", *param_model);
    require_numel(op, "param_model", *param_model, n, "numel of param");
  }
  return model;
}

AdamWCoeffs coeffs(const AdamWOptions& opt) {
  const double lr = opt.lr, b1 = opt.beta1, b2 = opt.beta2;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(opt.step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(opt.step));
  return AdamWCoeffs{.decay = static_cast<float>(1.0 - lr * opt.weight_decay),
                     .beta1 = opt.beta1,
                     .beta2 = opt.beta2,
                     .one_minus_b1 = static_cast<float>(1.0 - b1),
                     .one_minus_b2 = static_cast<float>(1.0 - b2),
                     .eps = opt.eps,
                     .bc2_sqrt = static_cast<float>(std::sqrt(bc2)),
                     .step_size = static_cast<float>(lr / bc1),
                     .grad_scale = opt.grad_scale};
}

bool aligned(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }
}  // namespace

void adamw_step(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad, Tensor* param_model,
                const AdamWOptions& opt, Stream stream) {
  const FOut model = check_adamw("adamw_step", param, exp_avg, exp_avg_sq, grad, param_model, opt);
  launch_adamw(param.data<float>(), exp_avg.data<float>(), exp_avg_sq.data<float>(), grad.data<float>(), model,
               coeffs(opt), param.numel(), stream_of(stream));
}

void adamw_multi_step(const std::vector<AdamWTensors>& list, const AdamWOptions& opt, Stream stream) {
  const char* op = "adamw_multi_step";
  const cudaStream_t s = stream_of(stream);
  AdamWOptions o = opt;
  AdamWMultiArgs a{};
  int nt = 0;
  auto flush = [&] {
    launch_adamw_multi(a, coeffs(o), s);  // coefficients besides decay do not depend on weight_decay
    a.blocks = 0;
    nt = 0;
  };
  for (size_t e = 0; e < list.size(); ++e) {
    const AdamWTensors& t = list[e];
    o.weight_decay = t.weight_decay;
    Tensor pm = t.param_model;  // a handle (fout_of takes a mutable tensor)
    const FOut model = check_adamw(op, t.param, t.exp_avg, t.exp_avg_sq, t.grad, pm.defined() ? &pm : nullptr, o);
    const int64_t n = t.param.numel();
    if (n == 0) continue;
    if (nt == kAdamMaxTensors) flush();
    const double lr = o.lr;
    AdamWTensorArgs& ta = a.t[nt];
    ta = AdamWTensorArgs{.p = t.param.data<float>(),
                         .m = t.exp_avg.data<float>(),
                         .v = t.exp_avg_sq.data<float>(),
                         .g = t.grad.data<float>(),
                         .model = model.p,
                         .n = n,
                         .decay = static_cast<float>(1.0 - lr * t.weight_decay),
                         .model_kind = model.kind,
                         .vec4 = 0};
    ta.vec4 = aligned(ta.p, 16) && aligned(ta.m, 16) && aligned(ta.v, 16) && aligned(ta.g, 16) &&
              (!ta.model || aligned(ta.model, model.kind == kF32 ? 16 : 8));
    const int slot = nt++;
    for (int64_t c = 0; c * kAdamChunk < n; ++c) {
      if (a.blocks == kAdamMaxChunks) {
        const AdamWTensorArgs keep = a.t[slot];
        flush();
        a.t[0] = keep;
        nt = 1;
      }
      const int cur = nt - 1;
      a.chunk_index[a.blocks] = static_cast<int32_t>(c);
      a.chunk_tensor[a.blocks] = static_cast<uint8_t>(cur);
      ++a.blocks;
    }
  }
  if (a.blocks > 0) flush();
}

double sum_of_squares(const Tensor& x, Stream stream) {
  const FIn fx = fin_of("sum_of_squares", "x", x);
  Tensor scratch = Tensor::empty({kReduceBlocks + 1}, DType::I64, Device::CUDA);  // 8-byte slots: partials + result
  double* partial = static_cast<double*>(scratch.raw());
  cudaStream_t s = stream_of(stream);
  if (s != compute_stream()) MCPP_CUDA_CHECK(cudaStreamSynchronize(compute_stream()));  // scratch allocated there
  launch_sum_of_squares(partial + kReduceBlocks, partial, fx, x.numel(), s);
  double result = 0.0;
  MCPP_CUDA_CHECK(cudaMemcpyAsync(&result, partial + kReduceBlocks, sizeof(double), cudaMemcpyDeviceToHost, s));
  MCPP_CUDA_CHECK(cudaStreamSynchronize(s));
  if (s != compute_stream()) MCPP_CUDA_CHECK(cudaStreamSynchronize(compute_stream()));  // before scratch is freed
  return result;
}

bool has_non_finite(const Tensor& x, Stream stream) {
  const FIn fx = fin_of("has_non_finite", "x", x);
  Tensor flag = Tensor::zeros({1}, DType::I32, Device::CUDA);  // zeroed on compute_stream()
  cudaStream_t s = stream_of(stream);
  if (s != compute_stream()) MCPP_CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
  launch_has_non_finite(flag.data<int32_t>(), fx, x.numel(), s);
  int32_t found = 0;
  MCPP_CUDA_CHECK(cudaMemcpyAsync(&found, flag.raw(), sizeof(found), cudaMemcpyDeviceToHost, s));
  MCPP_CUDA_CHECK(cudaStreamSynchronize(s));
  return found != 0;
}

}  // namespace mcpp::ops::cuda
