// Process-wide choice between the fast and the bitwise-reproducible form of the CUDA ops that have both
// (kernels/cuda): today embedding_bwd (atomicAdd per token, or every vocabulary row owned by one block that
// adds its tokens in position order — the CPU backend's order, so the result equals the CPU's bit for bit).
// Megatron's --deterministic-mode turns it on (training/process_settings.h) together with the GEMM
// autotuning switch-off and the mcpp attention kernels. Backend-neutral declarations; without CUDA the
// stub keeps the value and no op reads it.
#pragma once

namespace mcpp::ops::cuda {

void set_deterministic_kernels(bool on);
bool deterministic_kernels();

}  // namespace mcpp::ops::cuda
