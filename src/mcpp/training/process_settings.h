// Process-wide settings that a training config implies, applied by the Trainer's constructor (as
// Megatron's initialize_megatron applies --deterministic-mode to torch's global state). Today one:
//   model.deterministic_mode (--deterministic-mode) -> GEMM algorithm autotuning off
//     (ops::cuda::set_gemm_autotune(false), kernels/gemm_autotune.h): every process runs cuBLASLt's
//     heuristic #0, so separate runs pick the same algorithms and give the same bits. Without the flag
//     the switch is left as it is (MCPP_GEMM_AUTOTUNE, default on).
// Within one process a tuned choice never changes, so this only matters across runs: hence a process
// setting, not a Trainer one.
#pragma once

namespace mcpp {

struct Config;

void apply_process_settings(const Config& config);

}  // namespace mcpp
