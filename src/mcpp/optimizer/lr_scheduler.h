// Megatron's OptimizerParamScheduler (megatron/core/optimizer_param_scheduler.py), learning-rate part.
//
// Units are Megatron's "steps": with iteration-based training Megatron counts samples — warmup, decay
// and WSD-anneal lengths are iterations * global_batch_size, and the trainer calls step(global_batch_size)
// after each iteration. from_config() builds exactly that; iteration k (1-based) trains with the lr of
// num_steps = (k - 1) * global_batch_size, i.e. call get_lr() before the iteration's step().
//
// get_lr(num_steps), with warmup W (may be fractional: lr_warmup_fraction * decay), decay D:
//   W > 0 and n <= W:   init_lr + (max_lr - init_lr) * n / W              (linear warmup)
//   constant:           max_lr
//   n > D:              min_lr
//   inverse-square-root: max(min_lr, max_lr * sqrt(max(W, 1)) / sqrt(max(n, 1)))
//   otherwise r = (n - W) / (D - W), delta = max_lr - min_lr, lr = min_lr + coeff * delta with
//     linear: 1 - r;   cosine: 0.5 * (cos(pi * r) + 1);
//     WSD: 1 while n <= D - S (S = wsd decay steps), then with q = (n - (D - S)) / S:
//          exponential 2 * 0.5^q - 1 | linear 1 - q | cosine 0.5 * (cos(pi * q) + 1) | minus_sqrt 1 - sqrt(q)
// Weight decay stays constant (Megatron's wd_incr_style "constant").
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "mcpp/optimizer/optimizer_config.h"

namespace mcpp {

struct LrSchedulerOptions {
  double max_lr = 1e-4;
  double min_lr = 0.0;
  double init_lr = 0.0;       // warmup start (Megatron's --lr-warmup-init)
  double warmup_steps = 0.0;
  double decay_steps = 1.0;   // > warmup_steps
  LrDecayStyle decay_style = LrDecayStyle::Linear;
  double wsd_decay_steps = 0.0;              // WSD only: length of the final anneal
  std::string wsd_decay_style = "exponential";  // exponential | linear | cosine | minus_sqrt
};

class OptimizerParamScheduler {
 public:
  // Checks Megatron's asserts (0 <= min_lr <= max_lr, init_lr <= max_lr, decay_steps > 0,
  // warmup_steps < decay_steps, WSD needs wsd_decay_steps in (0, decay_steps]) as mcpp::Error.
  explicit OptimizerParamScheduler(const LrSchedulerOptions& opt);
  // Megatron's setup: steps in samples (iteration-based: iterations * global_batch_size; sample_based: the
  // *_samples lengths). Needs a finalized config (lr_decay_* set) and global_batch_size known
  // (Config::apply_world_size).
  static OptimizerParamScheduler from_config(const OptimizerConfig& o, int64_t global_batch_size, bool sample_based);

  double get_lr() const { return lr_at(num_steps_); }
  double lr_at(int64_t num_steps) const;
  void step(int64_t increment);  // num_steps += increment
  int64_t num_steps() const { return num_steps_; }
  const LrSchedulerOptions& options() const { return opt_; }

  // Megatron's state_dict keys (max_lr, min_lr, lr_warmup_steps, lr_decay_steps, lr_decay_style,
  // num_steps). load_state_dict refuses a checkpoint whose schedule differs (Megatron's default
  // _check_and_set without override), naming the field, then restores num_steps.
  nlohmann::json state_dict() const;
  void load_state_dict(const nlohmann::json& sd);

 private:
  LrSchedulerOptions opt_;
  int64_t num_steps_ = 0;
};

}  // namespace mcpp
