// Megatron's learning-rate schedule; formulas and units in lr_scheduler.h.
#include "mcpp/optimizer/lr_scheduler.h"

#include <algorithm>
#include <cmath>

#include "mcpp/core/error.h"

namespace mcpp {

OptimizerParamScheduler::OptimizerParamScheduler(const LrSchedulerOptions& opt) : opt_(opt) {
  if (!(opt.min_lr >= 0.0)) fail("lr scheduler: min_lr must be >= 0, got {}", opt.min_lr);
  if (!(opt.max_lr >= opt.min_lr)) fail("lr scheduler: lr ({}) must be >= min_lr ({})", opt.max_lr, opt.min_lr);
  if (!(opt.init_lr <= opt.max_lr)) fail("lr scheduler: lr_warmup_init ({}) must be <= lr ({})", opt.init_lr, opt.max_lr);
  if (!(opt.decay_steps > 0.0)) fail("lr scheduler: lr_decay_iters must be positive (got {} steps)", opt.decay_steps);
  if (!(opt.warmup_steps >= 0.0 && opt.warmup_steps < opt.decay_steps))
    fail("lr scheduler: lr_warmup_iters ({} steps) must be smaller than lr_decay_iters ({} steps)", opt.warmup_steps,
         opt.decay_steps);
  if (opt.decay_style == LrDecayStyle::WSD && !(opt.wsd_decay_steps > 0.0 && opt.wsd_decay_steps <= opt.decay_steps))
    fail("lr scheduler: lr_wsd_decay_iters ({} steps) must be in (0, lr_decay_iters = {} steps] with WSD",
         opt.wsd_decay_steps, opt.decay_steps);
  const std::string& w = opt.wsd_decay_style;
  if (w != "exponential" && w != "linear" && w != "cosine" && w != "minus_sqrt")
    fail("lr scheduler: lr_wsd_decay_style: unknown value '{}' (expected exponential|linear|cosine|minus_sqrt)", w);
}

OptimizerParamScheduler OptimizerParamScheduler::from_config(const OptimizerConfig& o, int64_t global_batch_size,
                                                             bool sample_based) {
  const double gbs = static_cast<double>(global_batch_size);
  if (!(gbs > 0)) fail("lr scheduler: global_batch_size is not known yet (call Config::apply_world_size)");
  const bool samples = sample_based;
  if ((samples ? o.lr_decay_samples : o.lr_decay_iters) <= 0)
    fail("lr scheduler: lr_decay_{} must be positive (call Config::finalize)", samples ? "samples" : "iters");
  const OptimizerConfig::Lengths len = o.lengths(samples, global_batch_size);
  LrSchedulerOptions s;
  s.max_lr = o.lr;
  s.min_lr = o.min_lr;
  s.init_lr = o.lr_warmup_init;
  s.decay_steps = len.decay;
  s.warmup_steps = len.warmup;
  s.decay_style = o.lr_decay_style;
  s.wsd_decay_steps = len.wsd;
  s.wsd_decay_style = o.lr_wsd_decay_style;
  return OptimizerParamScheduler(s);
}

double OptimizerParamScheduler::lr_at(int64_t num_steps) const {
  const double n = static_cast<double>(num_steps);
  const double W = opt_.warmup_steps, D = opt_.decay_steps;
  if (W > 0.0 && n <= W) return opt_.init_lr + (opt_.max_lr - opt_.init_lr) * n / W;
  if (opt_.decay_style == LrDecayStyle::Constant) return opt_.max_lr;
  if (n > D) return opt_.min_lr;
  if (opt_.decay_style == LrDecayStyle::InverseSquareRoot) {
    const double lr = opt_.max_lr * std::sqrt(std::max(W, 1.0)) / std::sqrt(std::max(n, 1.0));
    return std::max(opt_.min_lr, lr);
  }
  const double ratio = (n - W) / (D - W);
  const double delta = opt_.max_lr - opt_.min_lr;
  double coeff = 1.0;
  switch (opt_.decay_style) {
    case LrDecayStyle::Linear: coeff = 1.0 - ratio; break;
    case LrDecayStyle::Cosine: coeff = 0.5 * (std::cos(M_PI * ratio) + 1.0); break;
    case LrDecayStyle::WSD: {
      const double anneal_start = D - opt_.wsd_decay_steps;
      if (n <= anneal_start) break;
      const double q = (n - anneal_start) / opt_.wsd_decay_steps;
      const std::string& w = opt_.wsd_decay_style;
      if (w == "linear") coeff = 1.0 - q;
      else if (w == "cosine") coeff = 0.5 * (std::cos(M_PI * q) + 1.0);
      else if (w == "exponential") coeff = 2.0 * std::pow(0.5, q) - 1.0;
      else coeff = 1.0 - std::sqrt(q);  // minus_sqrt
      break;
    }
    case LrDecayStyle::Constant:
    case LrDecayStyle::InverseSquareRoot: break;  // handled above
  }
  return opt_.min_lr + coeff * delta;
}

void OptimizerParamScheduler::step(int64_t increment) {
  if (increment < 0) fail("lr scheduler: step increment must be >= 0, got {}", increment);
  num_steps_ += increment;
}

nlohmann::json OptimizerParamScheduler::state_dict() const {
  return {{"max_lr", opt_.max_lr},
          {"min_lr", opt_.min_lr},
          {"lr_warmup_steps", opt_.warmup_steps},
          {"lr_decay_steps", opt_.decay_steps},
          {"lr_decay_style", to_string(opt_.decay_style)},
          {"num_steps", num_steps_}};
}

void OptimizerParamScheduler::load_state_dict(const nlohmann::json& sd) {
  auto number = [&](const char* key) {
    if (!sd.contains(key) || !sd[key].is_number()) fail("lr scheduler state: missing number '{}'", key);
    return sd[key].get<double>();
  };
  auto same = [&](const char* key, double mine) {
    double saved = number(key);
    if (std::abs(saved - mine) > 1e-12 * std::max(1.0, std::abs(mine)))
      fail("lr scheduler state: {} in the checkpoint ({}) differs from this run ({})", key, saved, mine);
  };
  same("max_lr", opt_.max_lr);
  same("min_lr", opt_.min_lr);
  same("lr_warmup_steps", opt_.warmup_steps);
  same("lr_decay_steps", opt_.decay_steps);
  if (!sd.contains("lr_decay_style") || !sd["lr_decay_style"].is_string())
    fail("lr scheduler state: missing string 'lr_decay_style'");
  if (parse_lr_decay_style(sd["lr_decay_style"].get<std::string>(), "lr scheduler state: lr_decay_style") !=
      opt_.decay_style)
    fail("lr scheduler state: lr_decay_style in the checkpoint ({}) differs from this run ({})",
         sd["lr_decay_style"].get<std::string>(), to_string(opt_.decay_style));
  if (!sd.contains("num_steps") || !sd["num_steps"].is_number_integer() || sd["num_steps"].get<int64_t>() < 0)
    fail("lr scheduler state: missing non-negative integer 'num_steps'");
  num_steps_ = sd["num_steps"].get<int64_t>();
}

}  // namespace mcpp
