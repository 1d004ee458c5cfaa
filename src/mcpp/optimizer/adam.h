// Adam(W) over a list of parameters (Megatron's "adam" with decoupled weight decay, as Apex/TE FusedAdam
// in adam_w_mode and torch.optim.AdamW).
//
// Each parameter is an fp32 master tensor `param` with its fp32 `main_grad` (the buffer backward
// accumulates into). Parameters form Megatron's two default groups by `no_weight_decay`: biases and
// norm weights (flag set by the caller) are stepped with weight_decay 0, all others with
// AdamOptions::weight_decay. State exp_avg / exp_avg_sq is fp32 zeros, allocated per parameter on the
// parameter's device at construction. step(lr) advances the shared 1-based step counter and calls
// ops::adamw_step per parameter (CPU or CUDA by the tensors' device); it reads main_grad and never
// clears it (zeroing grads is the grad buffer's job). When `model_param` is defined (a bf16/fp32 model
// copy distinct from the master), the kernel writes the updated value into it too.
//
// Checkpointing: state() lists (name, exp_avg, exp_avg_sq) in parameter order; step_count() is the
// number of steps taken. load_state() copies saved moments in by name and restores the counter.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mcpp/core/tensor.h"

namespace mcpp {

struct OptimizerConfig;

struct AdamParam {
  std::string name;          // logical key, e.g. "decoder.layers.0.mlp.linear_fc1.weight"
  Tensor param;              // fp32 master weights, updated in place
  Tensor main_grad;          // fp32, same numel as param
  bool no_weight_decay = false;
  Tensor model_param{};      // optional model copy (bf16/f16/fp32) written after each update
};

struct AdamOptions {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;  // for params without no_weight_decay
};
AdamOptions adam_options_from(const OptimizerConfig& cfg);

struct AdamState {
  std::string name;
  Tensor exp_avg;     // fp32, param's numel and shape
  Tensor exp_avg_sq;  // fp32
};

class Adam {
 public:
  // Throws mcpp::Error naming the parameter when a tensor is missing, not fp32, or sizes differ, or
  // when two parameters share a name.
  Adam(std::vector<AdamParam> params, const AdamOptions& opt);

  // One AdamW update of every parameter with learning rate lr; grads are multiplied by grad_scale inside
  // the update (the grad-clip coefficient, ops::AdamWOptions::grad_scale; main_grad is not modified).
  void step(float lr, float grad_scale = 1.0f);
  int64_t step_count() const { return step_; }
  const AdamOptions& options() const { return opt_; }
  const std::vector<AdamParam>& params() const { return params_; }
  std::vector<Tensor> main_grads() const;  // for clip_grad_norm_fp32

  const std::vector<AdamState>& state() const { return state_; }
  // For each parameter, `lookup(name, exp_avg, exp_avg_sq)` fills the two fp32 tensors (shaped like
  // the parameter) from a checkpoint and returns false when the checkpoint has no state for `name`
  // (an mcpp::Error naming the parameter follows). Sets step_count() = step_count.
  using StateLookup = std::function<bool(const std::string& name, Tensor& exp_avg, Tensor& exp_avg_sq)>;
  void load_state(int64_t step_count, const StateLookup& lookup);

 private:
  std::vector<AdamParam> params_;
  std::vector<AdamState> state_;
  AdamOptions opt_;
  int64_t step_ = 0;
};

}  // namespace mcpp
