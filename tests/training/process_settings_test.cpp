// apply_process_settings: --deterministic-mode turns the process-wide GEMM algorithm autotuning off and
// the ordered (deterministic) CUDA kernels on; without it both switches are left as they were.
#include "mcpp/training/process_settings.h"

#include <gtest/gtest.h>

#include "mcpp/kernels/deterministic_kernels.h"
#include "mcpp/kernels/gemm_autotune.h"
#include "mcpp/training/config.h"

namespace mcpp {
namespace {

TEST(ProcessSettings, DeterministicModeTurnsGemmAutotuneOff) {
  const bool prev = ops::cuda::gemm_autotune(), prev_det = ops::cuda::deterministic_kernels();
  Config c;
  for (bool start : {true, false}) {
    ops::cuda::set_gemm_autotune(start);
    ops::cuda::set_deterministic_kernels(!start);
    apply_process_settings(c);
    EXPECT_EQ(ops::cuda::gemm_autotune(), start) << "changed without --deterministic-mode";
    EXPECT_EQ(ops::cuda::deterministic_kernels(), !start) << "changed without --deterministic-mode";
  }
  c.model.deterministic_mode = true;
  ops::cuda::set_gemm_autotune(true);
  ops::cuda::set_deterministic_kernels(false);
  apply_process_settings(c);
  EXPECT_FALSE(ops::cuda::gemm_autotune()) << "--deterministic-mode must turn GEMM autotuning off";
  EXPECT_TRUE(ops::cuda::deterministic_kernels()) << "--deterministic-mode must select the ordered kernels";
  ops::cuda::set_gemm_autotune(prev);
  ops::cuda::set_deterministic_kernels(prev_det);
}

}  // namespace
}  // namespace mcpp
