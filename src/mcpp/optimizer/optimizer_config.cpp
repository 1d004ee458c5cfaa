// OptimizerConfig's enum strings, field table, schedule lengths and validate(); contract in optimizer_config.h.
#include "mcpp/optimizer/optimizer_config.h"

#include "mcpp/core/error.h"

namespace mcpp {

std::string to_string(LrDecayStyle v) {
  switch (v) {
    case LrDecayStyle::Constant: return "constant";
    case LrDecayStyle::Linear: return "linear";
    case LrDecayStyle::Cosine: return "cosine";
    case LrDecayStyle::InverseSquareRoot: return "inverse-square-root";
    case LrDecayStyle::WSD: return "WSD";
  }
  return "?";
}

LrDecayStyle parse_lr_decay_style(const std::string& s, std::string_view field) {
  if (s == "constant") return LrDecayStyle::Constant;
  if (s == "linear") return LrDecayStyle::Linear;
  if (s == "cosine") return LrDecayStyle::Cosine;
  if (s == "inverse-square-root") return LrDecayStyle::InverseSquareRoot;
  if (s == "WSD") return LrDecayStyle::WSD;
  fail("{}: unknown value '{}' (expected constant|linear|cosine|inverse-square-root|WSD)", field, s);
}

// The optimizer changes no value a checkpoint's model computes: the table's default fingerprint is Never.
const config::FieldTable<OptimizerConfig>& OptimizerConfig::fields() {
  using Self = OptimizerConfig;
  using config::Range;
  static const config::FieldTable<Self> table{
      "optimizer", config::Fingerprint::Never,
      {
          MCPP_FIELD(optimizer).flag("--optimizer", "adam"),
          MCPP_FIELD(lr).flag("--lr").range(Range::non_negative()),
          MCPP_FIELD(min_lr).flag("--min-lr").range(Range::non_negative()),
          MCPP_FIELD(lr_warmup_init).flag("--lr-warmup-init").range(Range::non_negative()),
          MCPP_FIELD(lr_warmup_iters).flag("--lr-warmup-iters"),
          MCPP_FIELD(lr_warmup_fraction).flag("--lr-warmup-fraction").range(Range::unit_closed()),
          MCPP_FIELD(lr_decay_iters).flag("--lr-decay-iters"),
          MCPP_ENUM_FIELD(lr_decay_style, to_string, parse_lr_decay_style)
              .flag("--lr-decay-style", "constant|linear|cosine|inverse-square-root|WSD"),
          MCPP_FIELD(lr_wsd_decay_iters).flag("--lr-wsd-decay-iters"),
          MCPP_FIELD(lr_warmup_samples).flag("--lr-warmup-samples", "with --train-samples"),
          MCPP_FIELD(lr_decay_samples).flag("--lr-decay-samples", "with --train-samples (default: train_samples)"),
          MCPP_FIELD(lr_wsd_decay_samples).flag("--lr-wsd-decay-samples", "with --train-samples"),
          MCPP_FIELD(lr_wsd_decay_style).flag("--lr-wsd-decay-style", "exponential|linear|cosine|minus_sqrt"),
          MCPP_FIELD(weight_decay).flag("--weight-decay").range(Range::non_negative()),
          MCPP_FIELD(adam_beta1).flag("--adam-beta1").range(Range::unit_open()),
          MCPP_FIELD(adam_beta2).flag("--adam-beta2").range(Range::unit_open()),
          MCPP_FIELD(adam_eps).flag("--adam-eps").range(Range::positive()),
          MCPP_FIELD(clip_grad).flag("--clip-grad", "").range(Range::non_negative()),
      }};
  return table;
}

OptimizerConfig::Lengths OptimizerConfig::lengths(bool sample_based, int64_t global_batch_size) const {
  const double unit = sample_based ? 1.0 : static_cast<double>(global_batch_size);
  const double decay = static_cast<double>(sample_based ? lr_decay_samples : lr_decay_iters) * unit;
  // Megatron: lr_warmup_fraction * lr_decay_steps, else lr_warmup_iters * global_batch_size (or lr_warmup_samples)
  const double warmup = lr_warmup_fraction > 0.0f
                            ? static_cast<double>(lr_warmup_fraction) * decay
                            : static_cast<double>(sample_based ? lr_warmup_samples : lr_warmup_iters) * unit;
  return {warmup, decay, static_cast<double>(sample_based ? lr_wsd_decay_samples : lr_wsd_decay_iters) * unit};
}

using config::require_non_negative;

void OptimizerConfig::validate() const {
  config::check_fields(fields(), *this);  // finite floats in their ranges (lr, betas, eps, ...)
  if (optimizer != "adam") fail("optimizer: unknown value '{}' (only adam is implemented)", optimizer);
  if (lr < min_lr) fail("lr ({}) must be >= min_lr ({})", lr, min_lr);
  if (lr_warmup_init > lr) fail("lr_warmup_init ({}) must be in [0, lr = {}]", lr_warmup_init, lr);
  require_non_negative(lr_warmup_iters, "lr_warmup_iters");
  require_non_negative(lr_warmup_samples, "lr_warmup_samples");
  require_non_negative(lr_decay_samples, "lr_decay_samples");
  require_non_negative(lr_wsd_decay_samples, "lr_wsd_decay_samples");
  if (lr_warmup_fraction > 0.0f && lr_warmup_iters > 0)
    fail("lr_warmup_fraction ({}) and lr_warmup_iters ({}) are both set; give one", lr_warmup_fraction,
         lr_warmup_iters);
  if (lr_warmup_fraction > 0.0f && lr_warmup_samples > 0)
    fail("lr_warmup_fraction ({}) and lr_warmup_samples ({}) are both set; give one", lr_warmup_fraction,
         lr_warmup_samples);
  // the lengths themselves: Config::validate_lr_schedule, which knows the unit (iterations or samples)
  if (lr_wsd_decay_style != "exponential" && lr_wsd_decay_style != "linear" && lr_wsd_decay_style != "cosine" &&
      lr_wsd_decay_style != "minus_sqrt")
    fail("lr_wsd_decay_style: unknown value '{}' (expected exponential|linear|cosine|minus_sqrt)",
         lr_wsd_decay_style);
}

}  // namespace mcpp
