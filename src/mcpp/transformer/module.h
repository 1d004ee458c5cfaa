// What every module's forward needs besides its input: training vs eval (dropout on/off) and the RNG
// tracker dropout draws from. Explicit forward/backward (DESIGN.md decision 1): a module's saved state
// lives in a *Ctx struct the caller owns (one per microbatch per chunk); backward reads it.
#pragma once
#include "mcpp/tensor_parallel/random.h"

namespace mcpp {

struct ForwardOptions {
  bool training = true;                       // dropout active when true and p > 0
  tensor_parallel::RngTracker* rng = nullptr;  // dropout streams; required when training with dropout
};

inline bool dropout_active(const ForwardOptions& opt, float p) { return opt.training && p > 0.0f; }

}  // namespace mcpp
