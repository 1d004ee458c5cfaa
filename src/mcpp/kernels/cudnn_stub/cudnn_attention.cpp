// Builds without cuDNN: the fused attention has no engine, so the CUDA attention ops always run the mcpp
// flash kernels (kernels/cuda/cudnn_attention.h).
#include "mcpp/kernels/cuda/cudnn_attention.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::cuda_detail {
bool cudnn_attention_fwd(void*, float*, const void*, const void*, const void*, const AttnShape&, cudaStream_t) {
  return false;
}
bool cudnn_attention_bwd(void*, void*, void*, const void*, const void*, const void*, const void*, const void*,
                         const float*, float*, const AttnShape&, bool, cudaStream_t) {
  return false;
}
}  // namespace mcpp::cuda_detail

namespace mcpp::ops {
CudnnAttentionCounts cuda_cudnn_attention_counts() { return {}; }  // never runs without cuDNN
int64_t set_cudnn_plan_cache_capacity(int64_t capacity) {
  MCPP_CHECK(capacity >= 1, "set_cudnn_plan_cache_capacity: capacity must be >= 1, got {}", capacity);
  return 0;
}
}  // namespace mcpp::ops

namespace mcpp {
int cudnn_version() { return 0; }  // core/device_memory.h: no cuDNN in this build
}  // namespace mcpp
