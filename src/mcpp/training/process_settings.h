// Process-wide settings that a training config implies, applied by the Trainer's constructor (as
// Megatron's initialize_megatron applies --deterministic-mode to torch's global state):
//   model.deterministic_mode (--deterministic-mode) -> GEMM algorithm autotuning off
//     (ops::cuda::set_gemm_autotune(false), kernels/gemm_autotune.h): every process runs cuBLASLt's
//     heuristic #0, so separate runs pick the same algorithms and give the same bits; and the ordered
//     (atomics-free) form of the CUDA ops that have one (ops::cuda::set_deterministic_kernels(true),
//     kernels/deterministic_kernels.h: the embedding backward). Without the flag both switches are left
//     as they are (MCPP_GEMM_AUTOTUNE, default on; atomics). (The attention reads the flag per call:
//     AttentionOptions::deterministic, cuDNN's deterministic backward.)
// Within one process a tuned choice never changes, so this only matters across runs: hence a process
// setting, not a Trainer one.
#pragma once

namespace mcpp {

struct Config;

void apply_process_settings(const Config& config);

}  // namespace mcpp
