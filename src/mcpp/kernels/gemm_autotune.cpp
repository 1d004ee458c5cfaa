// The GEMM autotune switch and the bias-grad path (gemm_autotune.h), shared by the CUDA and the CPU-only
// build: atomics; the two switches' first values are read from MCPP_GEMM_AUTOTUNE / MCPP_GEMM_TUNE_IN_LOOP on
// first use, the path starts at kAuto.
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

std::atomic<bool>& in_loop_flag() {
  static std::atomic<bool> flag{parse_gemm_tune_in_loop_env(std::getenv("MCPP_GEMM_TUNE_IN_LOOP"))};
  return flag;
}

bool parse_switch(const char* name, const char* value, bool unset) {
  if (value == nullptr) return unset;
  if (std::strcmp(value, "1") == 0) return true;
  if (std::strcmp(value, "0") == 0) return false;
  fail("{} must be 0 or 1; got '{}'", name, value);
}

std::atomic<BiasGradPath>& bias_path() {
  static std::atomic<BiasGradPath> p{BiasGradPath::kAuto};
  return p;
}

}  // namespace

bool parse_gemm_autotune_env(const char* value) { return parse_switch("MCPP_GEMM_AUTOTUNE", value, true); }
bool parse_gemm_tune_in_loop_env(const char* value) {
  return parse_switch("MCPP_GEMM_TUNE_IN_LOOP", value, false);
}

void set_gemm_autotune(bool on) { autotune_flag().store(on); }
bool gemm_autotune() { return autotune_flag().load(); }
void set_gemm_tune_in_loop(bool on) { in_loop_flag().store(on); }
bool gemm_tune_in_loop() { return in_loop_flag().load(); }
void set_bias_grad_path(BiasGradPath p) { bias_path().store(p); }
BiasGradPath bias_grad_path() { return bias_path().load(); }

}  // namespace mcpp::ops::cuda
