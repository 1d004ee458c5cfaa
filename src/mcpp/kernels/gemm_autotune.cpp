// The GEMM autotune switch and the bias-grad path (gemm_autotune.h), shared by the CUDA and the CPU-only
// build: two atomics; the switch's first value is read from MCPP_GEMM_AUTOTUNE on first use, the path
// starts at kAuto.
#include "mcpp/kernels/gemm_autotune.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "mcpp/core/error.h"

namespace mcpp::ops::cuda {
namespace {

std::atomic<bool>& autotune_flag() {
  static std::atomic<bool> flag{parse_gemm_autotune_env(std::getenv("MCPP_GEMM_AUTOTUNE"))};
  return flag;
}

std::atomic<BiasGradPath>& bias_path() {
  static std::atomic<BiasGradPath> p{BiasGradPath::kAuto};
  return p;
}

}  // namespace

bool parse_gemm_autotune_env(const char* value) {
  if (value == nullptr || std::strcmp(value, "1") == 0) return true;
  if (std::strcmp(value, "0") == 0) return false;
  fail("MCPP_GEMM_AUTOTUNE must be 0 or 1; got '{}'", value);
}

void set_gemm_autotune(bool on) { autotune_flag().store(on); }
bool gemm_autotune() { return autotune_flag().load(); }
void set_bias_grad_path(BiasGradPath p) { bias_path().store(p); }
BiasGradPath bias_grad_path() { return bias_path().load(); }

}  // namespace mcpp::ops::cuda
