// Parameters in contiguous buffers (DESIGN.md decision 5; Megatron-Core's _ParamAndGradBuffer): the storage side
// of core/parameter.h's ParameterRegistry.
//
// Modules register each parameter (core/parameter.h: logical key, shape, init, weight-decay flag) while they are
// built; finalize() then allocates ONE param buffer (the model's dtype: fp32, or bf16 for mixed precision) and
// ONE fp32 main-grad buffer, laid out in backward
// order (the reverse of registration, i.e. the order gradients become ready), binds every Parameter's
// `data` and `main_grad` to views into them, and initializes values. Later the DP buckets are ranges of
// these buffers. Gradients ACCUMULATE into main_grad (+=); zero_grad() clears the whole buffer — or, with
// set_overwrite_main_grad(true) (the trainer's default), clears nothing and marks every parameter's
// main_grad stale: the step's first writer of a parameter either overwrites it (take_grad_overwrite: the
// wgrad GEMM with beta = 0, Transformer Engine's overwrite_main_grad) or, when it can only accumulate,
// zeroes it first (materialize_grads); zero_stale_grads() zeroes what no backward wrote, before the grads
// are read. This saves the buffer's zeroing pass and the first wgrad GEMM's read of main_grad. Every
// writer of main_grad must take one of the two paths (Parameter::grad_ready checks it).
// Mixed precision (param dtype bf16/f16, Megatron's --bf16 with fp32 main params): a third buffer holds
// the fp32 main (master) params in the same layout; every Parameter's `main_param` views it, `data` is
// the low-precision model copy the forward reads, and the optimizer steps `main_param` and writes
// `data`. With fp32 params, main_param and data are the same tensor. The distributed optimizer keeps only
// its DP rank's shard of the masters (Megatron's sharded fp32 main params): once it has copied its shard
// it calls release_main_params(), which frees the whole master buffer and leaves every `main_param`
// undefined — the masters then live only in the optimizer's shards (and checkpoints write them from there).
//
// Initialization is Megatron's (init_method_normal / scaled_init_method_normal, zeros for biases, ones
// for norm weights) drawn from a Philox stream keyed by (seed, xxh3(key)) over the LOGICAL tensor, then
// sliced to this rank's shard: a parameter's initial value depends only on its key and the seed — not
// on registration order or the parallel layout (Megatron's --use-cpu-initialization semantics).
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "mcpp/core/parameter.h"
#include "mcpp/core/tensor.h"

namespace mcpp {

class ParamAndGradBuffer : public ParameterRegistry {
 public:
  Parameter* add(ParamSpec spec) override;  // before finalize(); keys must be unique
  // Allocates and initializes (in fp32 on the host, then cast: the model copy is the rounded master).
  void finalize(uint64_t seed, Device device = Device::CPU, DType param_dtype = DType::F32);
  bool finalized() const { return finalized_; }

  void zero_grad();
  // zero_grad() marks main grads stale instead of zeroing the buffer (see the top of this file). Default off.
  void set_overwrite_main_grad(bool on) { overwrite_main_grad_ = on; }
  bool overwrite_main_grad() const { return overwrite_main_grad_; }
  // Zeroes every main grad still stale (no backward wrote it this step; one fill per adjacent run). Call
  // before the gradients are reduced or read (DistributedDataParallel's grad sync does).
  void zero_stale_grads();
  // Elements of stale main grads zeroed so far (materialize_grads, zero_stale_grads): the part of the
  // buffer the overwrite mode still zeroes (norms, embeddings, unwritten params); tests read it.
  int64_t stale_grads_zeroed() const { return stale_grads_zeroed_; }
  // Hook for Parameter::grad_ready (DDP's overlap of gradient reduction with backward); empty = none.
  void set_grad_ready_hook(std::function<void(Parameter&)> hook) { grad_ready_hook_ = std::move(hook); }
  const std::function<void(Parameter&)>& grad_ready_hook() const { return grad_ready_hook_; }
  Tensor& param_buffer() { return param_buffer_; }
  // fp32 master values of every parameter (the param buffer itself with fp32 params); mcpp::Error after
  // release_main_params().
  Tensor& main_param_buffer();
  bool mixed_precision() const { return param_buffer_.dtype() != DType::F32; }
  // Mixed precision only: frees the whole fp32 master buffer (the distributed optimizer holds this rank's
  // shard of it); every Parameter's main_param becomes undefined. mcpp::Error with fp32 params.
  void release_main_params();
  // Whether every parameter's fp32 master is here (main_param defined): false only after release.
  bool has_main_params() const { return !main_params_released_; }
  Tensor& grad_buffer() { return grad_buffer_; }
  int64_t numel() const { return param_buffer_.numel(); }

 protected:
  void on_grad_ready(Parameter& p) override;
  void zero_main_grads(int64_t offset, int64_t numel) override;

 private:
  Tensor param_buffer_;
  Tensor main_param_buffer_;  // fp32 masters, only with a low-precision param dtype
  Tensor grad_buffer_;
  bool finalized_ = false;
  bool main_params_released_ = false;
  bool overwrite_main_grad_ = false;
  int64_t stale_grads_zeroed_ = 0;
  std::function<void(Parameter&)> grad_ready_hook_;
};

}  // namespace mcpp
