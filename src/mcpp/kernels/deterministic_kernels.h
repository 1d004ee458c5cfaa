// Process-wide choice between the fast and the bitwise-reproducible form of the CUDA ops that have both
// (kernels/cuda): today embedding_bwd (atomicAdd per token, or every vocabulary row owned by one block that
// adds its tokens in position order — the CPU backend's order, so the result equals the CPU's bit for bit).
// Megatron's --deterministic-mode turns it on (training/process_settings.h) together with the GEMM
// autotuning switch-off and deterministic attention (AttentionOptions::deterministic: cuDNN's deterministic
// backward, or the mcpp kernels). Backend-neutral declarations; without CUDA the stub keeps the values and
// no op reads them.
// set_cudnn_attention(false): the bf16 attention ops skip cuDNN's fused attention and run the mcpp
// tensor-core kernels (default true; benchmarks and tests compare the two).
#pragma once

namespace mcpp::ops::cuda {

void set_deterministic_kernels(bool on);
bool deterministic_kernels();
void set_cudnn_attention(bool on);
bool cudnn_attention();

}  // namespace mcpp::ops::cuda
