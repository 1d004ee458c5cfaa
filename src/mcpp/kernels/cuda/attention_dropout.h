// Attention dropout on the CUDA attention ops (attention.cpp, attention_qkv.cpp): checks
// AttentionOptions::dropout_p (0 <= p < 1) and copies the key into the AttnShape the kernels read
// (philox.cuh AttnDropout). A call with dropout runs the mcpp kernels: cuDNN's fused attention draws its own
// random numbers, not the mask every other backend and path uses (core/rng.h), so it never takes one.
#pragma once
#include "mcpp/kernels/cuda/launch.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cuda {

void set_attention_dropout(const char* op, cuda_detail::AttnShape& a, const AttentionOptions& opt);
// cuDNN's fused attention may take the call (the process-wide switch is on and the call has no dropout).
bool cudnn_may_take(const AttentionOptions& opt);

}  // namespace mcpp::ops::cuda
