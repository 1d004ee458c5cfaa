#include "mcpp/tensor_parallel/fp8_state.h"

#include "mcpp/core/error.h"

namespace mcpp::tensor_parallel {

namespace {
Fp8TensorMeta make_meta(int64_t history_len, ops::Fp8Format format) {
  Fp8TensorMeta m{.scale = Tensor::empty({2}), .amax_history = Tensor::zeros({history_len}), .format = format};
  m.scale.fill_(1.0f);  // Transformer Engine's initial scale (and scale_inv)
  return m;
}
}  // namespace

Fp8LinearState::Fp8LinearState(const Fp8Options& opt, const std::string& prefix, comm::CommPtr tp)
    : opt_(opt), prefix_(prefix), tp_(std::move(tp)) {
  MCPP_CHECK(opt.enabled, "{}: FP8 state of a linear without FP8", prefix);
  const ops::Fp8Format grad_format = opt.hybrid ? ops::Fp8Format::E5M2 : ops::Fp8Format::E4M3;
  if (blockwise()) {  // per-call scales inside the ops: no tensors
    grad_.format = grad_format;
    return;
  }
  const int64_t len = opt.recipe == Fp8Recipe::Tensorwise ? 1 : opt.amax_history_len;
  input_ = make_meta(len, ops::Fp8Format::E4M3);
  weight_ = make_meta(len, ops::Fp8Format::E4M3);
  grad_ = make_meta(len, grad_format);
}

void Fp8LinearState::to_device(Device d) {
  for (Fp8TensorMeta* m : {&input_, &weight_, &grad_}) {
    if (m->scale.device() == d) continue;
    m->scale = m->scale.to(d);
    m->amax_history = m->amax_history.to(d);
  }
}

void Fp8LinearState::reduce_amax(Fp8TensorMeta& m) {
  if (tp_->size() == 1) return;
  Tensor slot = m.amax_history.narrow0(0, 1);
  tp_->all_reduce(slot, comm::ReduceOp::Max).wait();
}

void Fp8LinearState::update(Fp8TensorMeta& m) {
  reduce_amax(m);
  const bool tensorwise = opt_.recipe == Fp8Recipe::Tensorwise;
  ops::fp8_scale_update(m.scale, m.amax_history,
                        {.format = m.format, .margin = opt_.margin, .most_recent = tensorwise || opt_.amax_most_recent});
}

ops::Fp8Operand Fp8LinearState::prepare(Fp8TensorMeta& m, const Tensor& t) {
  if (opt_.recipe == Fp8Recipe::Tensorwise) {  // history[0] is 0 here (the last update zeroed it)
    Tensor slot = m.amax_history.narrow0(0, 1);
    ops::fp8_amax(slot, t);
    update(m);
    return {.scale = m.scale, .format = m.format};  // the amax is taken: the cast records nothing
  }
  return {.scale = m.scale, .amax = m.amax_history.narrow0(0, 1), .format = m.format};
}

Fp8LinearState::Forward Fp8LinearState::forward(const Tensor& x, const Tensor& w) {
  MCPP_CHECK(!blockwise(), "{}: blockwise FP8 keeps no per-tensor scales", prefix_);
  to_device(x.device());
  Forward f{.x = prepare(input_, x), .w = prepare(weight_, w), .x_scale = {}, .w_scale = {}};
  f.x_scale = input_.scale.clone();
  f.w_scale = weight_.scale.clone();
  return f;
}

Fp8LinearState::Forward Fp8LinearState::replayed(const Tensor& x_scale, const Tensor& w_scale) const {
  return {.x = {.scale = x_scale, .format = input_.format},
          .w = {.scale = w_scale, .format = weight_.format},
          .x_scale = x_scale,
          .w_scale = w_scale};
}

void Fp8LinearState::after_forward() {
  if (opt_.recipe != Fp8Recipe::Delayed) return;
  update(input_);
  update(weight_);
}

ops::Fp8Operand Fp8LinearState::backward(const Tensor& dy) {
  MCPP_CHECK(!blockwise(), "{}: blockwise FP8 keeps no per-tensor scales", prefix_);
  to_device(dy.device());
  return prepare(grad_, dy);
}

void Fp8LinearState::after_backward() {
  if (opt_.recipe == Fp8Recipe::Delayed) update(grad_);
}

std::vector<std::pair<std::string, Tensor*>> Fp8LinearState::state_tensors() {
  std::vector<std::pair<std::string, Tensor*>> out;
  if (blockwise()) return out;  // nothing kept between calls, nothing to checkpoint
  const std::pair<const char*, Fp8TensorMeta*> metas[] = {{"input", &input_}, {"weight", &weight_}, {"grad_output", &grad_}};
  for (const auto& [name, m] : metas) {
    out.emplace_back(prefix_ + ".fp8." + name + ".scale", &m->scale);
    out.emplace_back(prefix_ + ".fp8." + name + ".amax_history", &m->amax_history);
  }
  return out;
}

}  // namespace mcpp::tensor_parallel
