// DistributedDataParallelConfig (Megatron-Core's DistributedDataParallelConfig): how the data-parallel gradient
// reduction runs (distributed/data_parallel.h). Its fields stay in the "parallel" section of the config JSON /
// TOML (checkpoints and recipes written before it existed read unchanged). Fields declared once in fields()
// (core/config_fields.h); rules across configs (overlap_param_gather needs the distributed optimizer) are
// training/config.h's.
#pragma once
#include <cstdint>

#include "mcpp/core/config_fields.h"

namespace mcpp {

struct DistributedDataParallelConfig {
  // Bucket size in elements (Megatron's --ddp-bucket-size; 0 -> max(40M, 1M * dp)), overlap of the grad reduction
  // with backward, of the param all-gather with the next forward (distributed optimizer).
  int64_t ddp_bucket_size = 0;
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  // Each parameter's first gradient write of a step overwrites its main grad (a beta = 0 wgrad GEMM; TE's
  // overwrite_main_grad) instead of the step zeroing the whole grad buffer first; same values.
  // --no-overwrite-main-grad: zero the buffer (Megatron's zero_grad_buffer), for A/B runs and debugging.
  bool overwrite_main_grad = true;
  // Megatron's --fp8-param-gather (keep the FP8 weights and all-gather them in FP8 under the distributed optimizer):
  // accepted as a flag so a Megatron command line gets a named refusal; not implemented (training/config.cpp).
  bool fp8_param_gather = false;

  static const config::FieldTable<DistributedDataParallelConfig>& fields();
  void validate() const;
};

}  // namespace mcpp
