// cuBLASLt algorithm autotuning of the CUDA GEMMs (kernels/cuda/gemm_tuner.cpp; the rules in gemm.cpp's header):
// the process-wide switch and what the tuner measured. Backend-neutral declarations (no CUDA types), so the
// trainer, the tests and the kernel bench use them in every build; without CUDA the stub (kernels/cuda_stub)
// records nothing.
//
//   set_gemm_autotune(on)   process-wide switch. Its first value comes from the environment:
//                           MCPP_GEMM_AUTOTUNE=0|1 (unset: 1; any other value is an mcpp::Error naming the
//                           variable). Megatron's --deterministic-mode turns it off (the train command,
//                           training/process_settings.h), so every process runs cuBLASLt's heuristic #0
//                           and separate runs are bitwise reproducible.
//                           Takes effect at the next GEMM call (a tuned choice is used only while on).
//   gemm_autotune()         the current value.
//   parse_gemm_autotune_env(value)  the rule above for one value (nullptr = unset).
//   set_bias_grad_path(p)   how linear_bwd computes a bias grad next to its fp32-accumulating weight grad:
//                           kFused = the BGRADB epilogue of the wgrad GEMM; kSplit = the plain wgrad GEMM,
//                           then a column sum of dy (deterministic kernel); kAuto (default) = kFused while
//                           the autotune switch is off, else timed per GEMM shape at its first uncaptured
//                           call (both formulations, into scratch) and the split kept when >= 3% faster —
//                           cuBLASLt's BGRADB kernels for thin wgrads (124M: out 768-3072, k = 32768 tokens)
//                           ran 20-45% slower than its plain ones. One record per decision. Tests / bench.
//   gemm_tune_records()     one record per tuning, in order: the first call of each cached GEMM plan with
//                           the switch on and its stream not capturing a CUDA graph. The kernel bench's
//                           survey (cuda_kernels_bench --gemm-survey) prints them.
//   reset_gemm_tuning()     forgets every plan's tuned choice and the records: the next call of each plan
//                           tunes again (bench, tests).
//   last_gemm_algo_index()  the heuristic index (0 = cuBLASLt's first) of the algorithm the most recent
//                           cuBLASLt GEMM ran; -1 before any.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mcpp::ops::cuda {

struct GemmTuneRecord {
  std::string gemm;                  // e.g. "m32768 n2304 k768 x b^T bf16->bf16 beta0 BIAS" (row-major terms)
  int64_t m = 0, n = 0, k = 0;       // C[m, n] = op(A)[m, k] op(B)[k, n]
  std::vector<double> candidate_ms;  // heuristic order, median of the timed launches; NaN: cuBLASLt refused it
  int chosen = 0;                    // the index the plan uses while the switch is on
  std::vector<std::string> candidate_config;  // per candidate: cuBLASLt's algo config (id, tile, stages,
                                             // split-k, reduction, swizzle, cluster), e.g. "a66 t18 s23 k1"
  std::string note;                  // why nothing was timed (no scratch memory, ...); else empty
};

enum class BiasGradPath { kAuto, kFused, kSplit };

void set_gemm_autotune(bool on);
void set_bias_grad_path(BiasGradPath p);
BiasGradPath bias_grad_path();
bool gemm_autotune();
bool parse_gemm_autotune_env(const char* value);
std::vector<GemmTuneRecord> gemm_tune_records();
void reset_gemm_tuning();
int last_gemm_algo_index();

}  // namespace mcpp::ops::cuda
