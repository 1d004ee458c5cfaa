// DistributedDataParallelConfig's field table and validate(); contract in ddp_config.h.
#include "mcpp/distributed/ddp_config.h"

#include "mcpp/core/error.h"

namespace mcpp {

// How gradients are reduced changes no value a checkpoint computes: the table's default fingerprint is Never.
const config::FieldTable<DistributedDataParallelConfig>& DistributedDataParallelConfig::fields() {
  using Self = DistributedDataParallelConfig;
  static const config::FieldTable<Self> table{
      "parallel", config::Fingerprint::Never,
      {
          MCPP_FIELD(ddp_bucket_size).flag("--ddp-bucket-size", "elements per gradient bucket"),
          MCPP_FIELD(overlap_grad_reduce).store_true("--overlap-grad-reduce"),
          MCPP_FIELD(overlap_param_gather).store_true("--overlap-param-gather"),
          MCPP_FIELD(overwrite_main_grad)
              .store_false("--no-overwrite-main-grad",
                           "zero the grad buffer at each step's start instead of each parameter's first gradient "
                           "write overwriting its main grad (same values; for A/B runs)"),
          MCPP_FIELD(fp8_param_gather)
              .store_true("--fp8-param-gather",
                          "all-gather the FP8 weights in FP8 (distributed optimizer; refused: not implemented)"),
      }};
  return table;
}

void DistributedDataParallelConfig::validate() const {
  config::check_fields(fields(), *this);
  if (ddp_bucket_size < 0) fail("ddp_bucket_size must be >= 0, got {}", ddp_bucket_size);
}

}  // namespace mcpp
