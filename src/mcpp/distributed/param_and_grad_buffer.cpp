// ParamAndGradBuffer; contract in param_and_grad_buffer.h (Parameter, init and shard copies: core/parameter.cpp).
#include "mcpp/distributed/param_and_grad_buffer.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "mcpp/core/error.h"

namespace mcpp {

Parameter* ParamAndGradBuffer::add(ParamSpec spec) {
  MCPP_CHECK(!finalized_, "parameter '{}' registered after the buffer was finalized", spec.key);
  return ParameterRegistry::add(std::move(spec));
}

void ParamAndGradBuffer::finalize(uint64_t seed, Device device, DType param_dtype) {
  MCPP_CHECK(!finalized_, "ParamAndGradBuffer finalized twice");
  int64_t total = 0;
  for (const auto& p : params()) total += shape_numel(p->spec.shape);
  param_buffer_ = Tensor::zeros({total}, DType::F32, Device::CPU);
  grad_buffer_ = Tensor::zeros({total}, DType::F32, device);
  // Backward order: the last registered parameter (closest to the loss) sits at offset 0.
  int64_t offset = 0;
  for (auto it = params().rbegin(); it != params().rend(); ++it) {
    Parameter& p = **it;
    const int64_t n = shape_numel(p.spec.shape);
    p.data = param_buffer_.flat_slice(offset, p.spec.shape);
    switch (p.spec.init) {
      case InitKind::Normal:
        if (p.spec.shard.partitioned()) {
          Tensor global = Tensor::empty(p.spec.shard.global_shape);
          init_normal(global, p.spec.std, seed, p.spec.key);
          copy_shard_from_global(p.data, global, p.spec.shard);
        } else {
          init_normal(p.data, p.spec.std, seed, p.spec.key);
        }
        break;
      case InitKind::Zeros: break;
      case InitKind::Ones: p.data.fill_(1.0f); break;
    }
    offset += n;
  }
  if (param_dtype != DType::F32) {
    // Megatron's mixed precision: the model copy is the master rounded to bf16/f16 (cast on the host,
    // round to nearest even), the master keeps the fp32 initial value.
    main_param_buffer_ = param_buffer_.to(device);
    param_buffer_ = param_buffer_.to(param_dtype).to(device);
  } else if (device != Device::CPU) {
    param_buffer_ = param_buffer_.to(device);
  }
  offset = 0;
  for (auto it = params().rbegin(); it != params().rend(); ++it) {
    Parameter& p = **it;
    p.data = param_buffer_.flat_slice(offset, p.spec.shape);
    p.main_param = main_param_buffer().flat_slice(offset, p.spec.shape);
    p.main_grad = grad_buffer_.flat_slice(offset, p.spec.shape);
    p.offset = offset;
    offset += shape_numel(p.spec.shape);
  }
  finalized_ = true;
}

Tensor& ParamAndGradBuffer::main_param_buffer() {
  if (!mixed_precision()) return param_buffer_;
  if (main_params_released_)
    fail("ParamAndGradBuffer: the fp32 main params are sharded by the distributed optimizer (each DP rank "
         "holds only its shard); read them from the optimizer's pieces");
  return main_param_buffer_;
}

void ParamAndGradBuffer::release_main_params() {
  MCPP_CHECK(finalized_, "ParamAndGradBuffer::release_main_params before finalize");
  if (!mixed_precision())
    fail("ParamAndGradBuffer: release_main_params needs mixed precision (with {} params the model params are "
         "the main params)", dtype_name(param_buffer_.dtype()));
  main_param_buffer_ = Tensor();
  for (const auto& p : params()) p->main_param = Tensor();
  main_params_released_ = true;
}

void ParamAndGradBuffer::zero_grad() {
  if (!overwrite_main_grad_) {
    grad_buffer_.zero_();
    return;
  }
  for (const auto& p : params()) p->grad_stale = true;
}

void ParamAndGradBuffer::zero_main_grads(int64_t offset, int64_t numel) {
  grad_buffer_.flat_slice(offset, {numel}).zero_();
  stale_grads_zeroed_ += numel;
}

void ParamAndGradBuffer::zero_stale_grads() {
  std::vector<Parameter*> ps;
  for (const auto& p : params()) ps.push_back(p.get());
  zero_stale_main_grads(std::move(ps));
}

void ParamAndGradBuffer::on_grad_ready(Parameter& p) {
  if (grad_ready_hook_) grad_ready_hook_(p);
}

}  // namespace mcpp
