// Parameters in contiguous buffers (DESIGN.md decision 5; Megatron-Core's _ParamAndGradBuffer).
//
// Modules register each parameter (logical key, shape, init, weight-decay flag) while they are built;
// finalize() then allocates ONE fp32 param buffer and ONE fp32 main-grad buffer, laid out in backward
// order (the reverse of registration, i.e. the order gradients become ready), binds every Parameter's
// `data` and `main_grad` to views into them, and initializes values. Later the DP buckets are ranges of
// these buffers. Gradients ACCUMULATE into main_grad (+=); zero_grad() clears the whole buffer.
//
// Initialization is Megatron's (init_method_normal / scaled_init_method_normal, zeros for biases, ones
// for norm weights) drawn from a Philox stream keyed by (seed, xxh3(key)), so a parameter's initial value
// depends only on its key and the seed — not on registration order or, later, on the parallel layout.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mcpp/core/tensor.h"

namespace mcpp {

enum class InitKind { Normal, Zeros, Ones };

struct ParamSpec {
  std::string key;  // e.g. "decoder.layers.0.mlp.linear_fc1.weight"
  Shape shape;
  InitKind init = InitKind::Normal;
  float std = 0.02f;            // for InitKind::Normal
  bool no_weight_decay = false;  // biases and norm weights (Megatron's no_wd params)
};

struct Parameter {
  ParamSpec spec;
  Tensor data;       // fp32 view into the param buffer
  Tensor main_grad;  // fp32 view into the grad buffer; accumulates
};

class ParamAndGradBuffer {
 public:
  Parameter* add(ParamSpec spec);  // before finalize(); keys must be unique
  void finalize(uint64_t seed, Device device = Device::CPU);
  bool finalized() const { return finalized_; }

  void zero_grad();
  const std::vector<std::unique_ptr<Parameter>>& params() const { return params_; }  // registration order
  Parameter* find(const std::string& key) const;  // nullptr when absent
  Tensor& param_buffer() { return param_buffer_; }
  Tensor& grad_buffer() { return grad_buffer_; }
  int64_t numel() const { return param_buffer_.numel(); }

 private:
  std::vector<std::unique_ptr<Parameter>> params_;
  Tensor param_buffer_;
  Tensor grad_buffer_;
  bool finalized_ = false;
};

// Fill a float32 CPU tensor with N(0, std) from the Philox stream of (seed, key).
void init_normal(Tensor& t, float std, uint64_t seed, const std::string& key);

}  // namespace mcpp
