// Adam(W): ops::adamw_multi_step over every parameter (per-parameter weight decay) — identical to
// per-parameter ops::adamw_step; see adam.h for the contract.
#include "mcpp/optimizer/adam.h"

#include <set>

#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/optimizer/optimizer_config.h"

namespace mcpp {

AdamOptions adam_options_from(const OptimizerConfig& cfg) {
  return AdamOptions{.beta1 = cfg.adam_beta1, .beta2 = cfg.adam_beta2, .eps = cfg.adam_eps,
                     .weight_decay = cfg.weight_decay};
}

Adam::Adam(std::vector<AdamParam> params, const AdamOptions& opt) : params_(std::move(params)), opt_(opt) {
  if (!(opt.beta1 >= 0.0f && opt.beta1 < 1.0f)) fail("Adam: adam_beta1 must be in [0, 1), got {}", opt.beta1);
  if (!(opt.beta2 >= 0.0f && opt.beta2 < 1.0f)) fail("Adam: adam_beta2 must be in [0, 1), got {}", opt.beta2);
  if (!(opt.eps > 0.0f)) fail("Adam: adam_eps must be positive, got {}", opt.eps);
  if (!(opt.weight_decay >= 0.0f)) fail("Adam: weight_decay must be >= 0, got {}", opt.weight_decay);
  std::set<std::string> names;
  state_.reserve(params_.size());
  for (const AdamParam& p : params_) {
    if (!names.insert(p.name).second) fail("Adam: parameter '{}' is listed twice", p.name);
    if (!p.param.defined() || p.param.dtype() != DType::F32)
      fail("Adam: parameter '{}' must be a float32 tensor, got {}", p.name,
           p.param.defined() ? p.param.str() : "undefined");
    if (!p.main_grad.defined() || p.main_grad.dtype() != DType::F32 || p.main_grad.numel() != p.param.numel())
      fail("Adam: main_grad of '{}' must be float32 with {} elements, got {}", p.name, p.param.numel(),
           p.main_grad.defined() ? p.main_grad.str() : "undefined");
    if (p.model_param.defined() && p.model_param.numel() != p.param.numel())
      fail("Adam: model_param of '{}' must have {} elements, got {}", p.name, p.param.numel(), p.model_param.str());
    state_.push_back(AdamState{p.name, Tensor::zeros(p.param.shape(), DType::F32, p.param.device()),
                               Tensor::zeros(p.param.shape(), DType::F32, p.param.device())});
  }
}

void Adam::step(float lr, float grad_scale) {
  ++step_;
  std::vector<ops::AdamWTensors> list;
  list.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const AdamParam& p = params_[i];
    list.push_back(ops::AdamWTensors{.param = p.param, .exp_avg = state_[i].exp_avg,
                                     .exp_avg_sq = state_[i].exp_avg_sq, .grad = p.main_grad,
                                     .param_model = p.model_param,
                                     .weight_decay = p.no_weight_decay ? 0.0f : opt_.weight_decay});
  }
  const ops::AdamWOptions o{
      .lr = lr, .beta1 = opt_.beta1, .beta2 = opt_.beta2, .eps = opt_.eps, .step = step_, .grad_scale = grad_scale};
  ops::adamw_multi_step(list, o);  // = adamw_step per parameter, one launch per ~300 chunks on CUDA
}

std::vector<Tensor> Adam::main_grads() const {
  std::vector<Tensor> out;
  out.reserve(params_.size());
  for (const AdamParam& p : params_) out.push_back(p.main_grad);
  return out;
}

void Adam::load_state(int64_t step_count, const StateLookup& lookup) {
  if (step_count < 0) fail("Adam: step count in the checkpoint must be >= 0, got {}", step_count);
  for (AdamState& s : state_) {
    if (!lookup(s.name, s.exp_avg, s.exp_avg_sq)) fail("Adam: the checkpoint has no optimizer state for '{}'", s.name);
  }
  step_ = step_count;
}

}  // namespace mcpp
