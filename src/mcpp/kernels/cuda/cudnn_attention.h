// cuDNN fused flash attention (kernels/cudnn/cudnn_attention.cpp; kernels/cudnn_stub/ when the build has
// no cuDNN). Same arguments and semantics as launch_attention_{fwd,bwd}_mma (launch.h): bf16 tensors,
// q/k/v/dq/dk/dv addressed by the AttnShape layout fields, o/dout [s, b, nq, d], lse [b, nq, s];
// bwd: delta is a float32 [b, nq, s] scratch, dq/dk/dv overwritten.
// Each returns false (nothing enqueued) when cuDNN has no engine for the case, true when the work is
// enqueued on s. The default backward is not bit-identical run to run (cuDNN accumulates dQ with atomics);
// deterministic = true builds the graph cuDNN serves with its deterministic (dP-workspace) engine: bitwise
// repeatable, slower, ~b nq s^2 2 bytes of workspace. The forward is deterministic either way.
#pragma once
#include <cuda_runtime.h>

#include "mcpp/kernels/cuda/launch.h"

namespace mcpp::cuda_detail {
bool cudnn_attention_fwd(void* o, float* lse, const void* q, const void* k, const void* v, const AttnShape& a,
                         cudaStream_t s);
bool cudnn_attention_bwd(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                         const void* v, const void* o, const float* lse, float* delta, const AttnShape& a,
                         bool deterministic, cudaStream_t s);
}  // namespace mcpp::cuda_detail
