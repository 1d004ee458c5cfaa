// apply_process_settings: --deterministic-mode turns the process-wide GEMM algorithm autotuning off;
// without it the switch is left as it was.
#include "mcpp/training/process_settings.h"

#include <gtest/gtest.h>

#include "mcpp/kernels/gemm_autotune.h"
#include "mcpp/transformer/transformer_config.h"

namespace mcpp {
namespace {

TEST(ProcessSettings, DeterministicModeTurnsGemmAutotuneOff) {
  const bool prev = ops::cuda::gemm_autotune();
  Config c;
  for (bool start : {true, false}) {
    ops::cuda::set_gemm_autotune(start);
    apply_process_settings(c);
    EXPECT_EQ(ops::cuda::gemm_autotune(), start) << "changed without --deterministic-mode";
  }
  c.model.deterministic_mode = true;
  ops::cuda::set_gemm_autotune(true);
  apply_process_settings(c);
  EXPECT_FALSE(ops::cuda::gemm_autotune()) << "--deterministic-mode must turn GEMM autotuning off";
  ops::cuda::set_gemm_autotune(prev);
}

}  // namespace
}  // namespace mcpp
