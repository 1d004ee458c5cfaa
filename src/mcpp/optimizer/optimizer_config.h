// OptimizerConfig: Adam and the learning-rate schedule (Megatron's --lr, --lr-decay-style, --adam-beta1, ...; the
// optimizer section of the config JSON / TOML). Fields declared once in fields() (core/config_fields.h);
// validate() checks its own fields (one-line mcpp::Error naming the field); the schedule's lengths, which need
// the training's unit (iterations or samples), are checked by training/config.h's Config::validate_lr_schedule.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "mcpp/core/config_fields.h"

namespace mcpp {

enum class LrDecayStyle { Constant, Linear, Cosine, InverseSquareRoot, WSD };
// Megatron's strings: "constant"|"linear"|"cosine"|"inverse-square-root"|"WSD". Parsing throws mcpp::Error
// naming `field`.
std::string to_string(LrDecayStyle v);
LrDecayStyle parse_lr_decay_style(const std::string& s, std::string_view field);

struct OptimizerConfig {
  std::string optimizer = "adam";
  float lr = 1e-4f;
  float min_lr = 0.0f;
  float lr_warmup_init = 0.0f;      // Megatron's init_lr: warmup ramps from here to lr
  int64_t lr_warmup_iters = 0;
  float lr_warmup_fraction = 0.0f;  // when > 0: warmup = fraction * lr_decay_iters (lr_warmup_iters must be 0)
  int64_t lr_decay_iters = 0;       // 0 -> train_iters (Config::finalize)
  LrDecayStyle lr_decay_style = LrDecayStyle::Linear;
  int64_t lr_wsd_decay_iters = 0;   // WSD: length of the final anneal (required with WSD)
  // The same lengths in samples, for sample-based training (TrainingConfig::train_samples; Megatron's
  // --lr-warmup-samples / --lr-decay-samples / --lr-wsd-decay-samples); lr_decay_samples 0 -> train_samples.
  int64_t lr_warmup_samples = 0;
  int64_t lr_decay_samples = 0;
  int64_t lr_wsd_decay_samples = 0;
  std::string lr_wsd_decay_style = "exponential";  // exponential | linear | cosine | minus_sqrt
  float weight_decay = 0.01f;
  float adam_beta1 = 0.9f;
  float adam_beta2 = 0.999f;
  float adam_eps = 1e-8f;
  float clip_grad = 1.0f;  // 0 disables

  // The schedule's lengths in Megatron's steps (samples): iteration-based, the *_iters times global_batch_size;
  // sample-based, the *_samples. Warmup may be fractional (lr_warmup_fraction * decay).
  struct Lengths {
    double warmup, decay, wsd;
  };
  Lengths lengths(bool sample_based, int64_t global_batch_size) const;
  static const config::FieldTable<OptimizerConfig>& fields();
  void validate() const;
};

}  // namespace mcpp
