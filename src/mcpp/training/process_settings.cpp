// See process_settings.h.
#include "mcpp/training/process_settings.h"

#include "mcpp/kernels/deterministic_kernels.h"
#include "mcpp/kernels/gemm_autotune.h"
#include "mcpp/training/config.h"

namespace mcpp {

void apply_process_settings(const Config& config) {
  if (!config.model.deterministic_mode) return;
  ops::cuda::set_gemm_autotune(false);
  ops::cuda::set_deterministic_kernels(true);
}

}  // namespace mcpp
