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

int Fp8UpdateGroup::add(Pass p, Fp8TensorMeta* m, const ops::Fp8ScalingOptions& opt) {
  List& l = list(p);
  MCPP_CHECK(!l.amax.defined(), "an FP8 tensor joined its update group after the group's first pass");
  l.metas.emplace_back(m, opt);
  return static_cast<int>(l.metas.size()) - 1;
}

Tensor Fp8UpdateGroup::record(Pass p, int slot, Device d) {
  List& l = list(p);
  if (!l.amax.defined()) l.amax = Tensor::zeros({static_cast<int64_t>(l.metas.size())}, DType::F32, d);
  MCPP_CHECK(l.amax.device() == d, "an FP8 update group's tensors on two devices ({} and {})",
             device_name(l.amax.device()), device_name(d));
  MCPP_CHECK(slot >= 0 && slot < static_cast<int>(l.metas.size()), "FP8 update group: no slot {}", slot);
  if (l.marked.empty()) l.marked.assign(l.metas.size(), 0);
  MCPP_CHECK(!l.marked[static_cast<size_t>(slot)], "an FP8 tensor recorded its amax twice in one pass (its linear ran "
             "twice before the model's flush); a linear runs once per forward and once per backward pass");
  l.marked[static_cast<size_t>(slot)] = 1;
  if (p == Pass::Forward && l.recorded.empty())  // the pass's first record: its buffer of scales for the backward
    l.before = Tensor::empty({static_cast<int64_t>(l.metas.size()), 2}, DType::F32, d);
  l.recorded.push_back(slot);
  return l.amax.narrow0(slot, 1);
}

Tensor Fp8UpdateGroup::forward_scale(int slot) {
  List& l = list(Pass::Forward);
  MCPP_CHECK(slot >= 0 && static_cast<size_t>(slot) < l.marked.size() && l.marked[static_cast<size_t>(slot)],
             "FP8 update group: the scale of slot {} was not recorded in this forward pass", slot);
  return scale_copy(l, slot);
}

void Fp8UpdateGroup::begin(Pass p) {
  List& l = list(p);
  if (l.recorded.empty()) return;
  for (int slot : l.recorded) l.marked[static_cast<size_t>(slot)] = 0;
  l.recorded.clear();
  l.before = Tensor();
  l.amax.zero_();
}

void Fp8UpdateGroup::flush(Pass p) {
  List& l = list(p);
  if (l.recorded.empty()) return;
  if (tp_->size() > 1) tp_->all_reduce(l.amax, comm::ReduceOp::Max).wait();  // every slot in one call
  std::vector<ops::Fp8ScaleState> states;
  states.reserve(l.recorded.size());
  for (int slot : l.recorded) {
    const auto& [m, opt] = l.metas[static_cast<size_t>(slot)];
    states.push_back({.scale = m->scale,
                      .amax_history = m->amax_history,
                      .amax_slot = slot,
                      .opt = opt,
                      .scale_before = l.before.defined() ? scale_copy(l, slot) : Tensor()});
    l.marked[static_cast<size_t>(slot)] = 0;
  }
  l.recorded.clear();
  l.before = Tensor();  // the pass's contexts keep their views; the next pass writes a new buffer
  ops::fp8_scale_update_multi(states, l.amax);
}

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
  if (delayed() && opt.updates) {
    group_ = opt.updates;
    MCPP_CHECK(group_->tp() == tp_, "{}: its FP8 update group reduces over another TP group", prefix_);
    using P = Fp8UpdateGroup::Pass;
    input_.group_slot = group_->add(P::Forward, &input_, scaling(input_));
    weight_.group_slot = group_->add(P::Forward, &weight_, scaling(weight_));
    grad_.group_slot = group_->add(P::Backward, &grad_, scaling(grad_));
  }
}

ops::Fp8ScalingOptions Fp8LinearState::scaling(const Fp8TensorMeta& m) const {
  const bool tensorwise = opt_.recipe == Fp8Recipe::Tensorwise;
  return {.format = m.format, .margin = opt_.margin, .most_recent = tensorwise || opt_.amax_most_recent};
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
  ops::fp8_scale_update(m.scale, m.amax_history, scaling(m));
}

ops::Fp8Operand Fp8LinearState::prepare(Fp8TensorMeta& m, const Tensor& t, Fp8UpdateGroup::Pass p) {
  if (opt_.recipe == Fp8Recipe::Tensorwise) {  // history[0] is 0 here (the last update zeroed it)
    Tensor slot = m.amax_history.narrow0(0, 1);
    ops::fp8_amax(slot, t);
    update(m);
    return {.scale = m.scale, .format = m.format};  // the amax is taken: the cast records nothing
  }
  Tensor slot = group_ ? group_->record(p, m.group_slot, t.device()) : m.amax_history.narrow0(0, 1);
  return {.scale = m.scale, .amax = slot, .format = m.format};
}

Fp8LinearState::Forward Fp8LinearState::forward(const Tensor& x, const Tensor& w) {
  MCPP_CHECK(!blockwise(), "{}: blockwise FP8 keeps no per-tensor scales", prefix_);
  to_device(x.device());
  using P = Fp8UpdateGroup::Pass;
  Forward f{.x = prepare(input_, x, P::Forward), .w = prepare(weight_, w, P::Forward), .x_scale = {}, .w_scale = {}};
  f.x_scale = group_ ? group_->forward_scale(input_.group_slot) : input_.scale.clone();
  f.w_scale = group_ ? group_->forward_scale(weight_.group_slot) : weight_.scale.clone();
  return f;
}

Fp8LinearState::Forward Fp8LinearState::replayed(const Tensor& x_scale, const Tensor& w_scale) const {
  return {.x = {.scale = x_scale, .format = input_.format},
          .w = {.scale = w_scale, .format = weight_.format},
          .x_scale = x_scale,
          .w_scale = w_scale};
}

void Fp8LinearState::after_forward() {
  if (!delayed() || group_) return;  // a group updates at the end of the pass
  update(input_);
  update(weight_);
}

ops::Fp8Operand Fp8LinearState::backward(const Tensor& dy) {
  MCPP_CHECK(!blockwise(), "{}: blockwise FP8 keeps no per-tensor scales", prefix_);
  to_device(dy.device());
  return prepare(grad_, dy, Fp8UpdateGroup::Pass::Backward);
}

void Fp8LinearState::after_backward() {
  if (delayed() && !group_) update(grad_);
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
