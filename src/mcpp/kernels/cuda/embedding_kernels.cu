// Device code for embedding.cpp.
//   fwd: one block per token; threads copy row ids[t] - vocab_start of the table (zeros outside [0, V)).
//   bwd: one block per token; threads atomicAdd dout[t, :] into dtable[ids[t] - vocab_start, :] (fp32).
//        Tokens sharing an id add in an unspecified order: last-bit differences between runs are possible.
#include "mcpp/kernels/cuda/device_utils.cuh"

namespace mcpp::cuda_detail {
namespace {
constexpr int kThreads = 256;

__global__ void embedding_fwd_kernel(FOut out, const int32_t* ids, FIn table, int64_t v, int64_t h,
                                     int64_t vocab_start) {
  const int64_t t = blockIdx.x;
  const int64_t row = static_cast<int64_t>(ids[t]) - vocab_start;
  const bool in = row >= 0 && row < v;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) out.set(t * h + c, in ? table[row * h + c] : 0.0f);
}

__global__ void embedding_bwd_kernel(float* dtable, const int32_t* ids, FIn dout, int64_t v, int64_t h,
                                     int64_t vocab_start) {
  const int64_t t = blockIdx.x;
  const int64_t row = static_cast<int64_t>(ids[t]) - vocab_start;
  if (row < 0 || row >= v) return;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) atomicAdd(dtable + row * h + c, dout[t * h + c]);
}
}  // namespace

void launch_embedding_fwd(FOut out, const int32_t* ids, FIn table, int64_t n, int64_t v, int64_t h,
                          int64_t vocab_start, cudaStream_t s) {
  if (n <= 0 || h <= 0) return;
  embedding_fwd_kernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(out, ids, table, v, h, vocab_start);
  MCPP_CUDA_LAUNCH_CHECK();
}
void launch_embedding_bwd(float* dtable, const int32_t* ids, FIn dout, int64_t n, int64_t v, int64_t h,
                          int64_t vocab_start, cudaStream_t s) {
  if (n <= 0 || h <= 0) return;
  embedding_bwd_kernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(dtable, ids, dout, v, h, vocab_start);
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
