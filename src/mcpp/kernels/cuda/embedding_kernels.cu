// Device code for embedding.cpp.
//   fwd: one block per token; threads copy row ids[t] - vocab_start of the table (zeros outside [0, V)).
//   bwd: one block per token; threads atomicAdd dout[t, :] into dtable[ids[t] - vocab_start, :] (fp32).
//        Tokens sharing an id add in an unspecified order: last-bit differences between runs are possible.
//   bwd ordered (deterministic_kernels()): rows owned by blocks, tokens added in position order (below).
#include <algorithm>

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

// Deterministic backward: block b owns the table rows r with r % gridDim.x == b. It walks the tokens in
// chunks of kOrderedChunk; each chunk's owned positions are compacted in order (each thread looks at
// kPerThread consecutive positions, a block-wide exclusive scan gives its output slot), then every thread
// adds its columns of those rows one position after the other. Each (row, column) is written by one
// thread in position order: the CPU backend's summation order.
constexpr int kOrderedThreads = 256, kPerThread = 4, kOrderedChunk = kOrderedThreads * kPerThread;

__global__ void __launch_bounds__(kOrderedThreads) embedding_bwd_ordered_kernel(float* dtable, const int32_t* ids,
                                                                                FIn dout, int64_t n, int64_t v,
                                                                                int64_t h, int64_t vocab_start) {
  __shared__ int32_t positions[kOrderedChunk];
  __shared__ int32_t scan[kOrderedThreads];
  const int64_t owners = gridDim.x;
  for (int64_t base = 0; base < n; base += kOrderedChunk) {
    int mine = 0;
    bool own[kPerThread];
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int64_t t = base + threadIdx.x * kPerThread + k;
      const int64_t row = t < n ? static_cast<int64_t>(ids[t]) - vocab_start : -1;
      own[k] = row >= 0 && row < v && row % owners == blockIdx.x;
      mine += own[k] ? 1 : 0;
    }
    int count = 0;
    int slot = block_exclusive_scan<kOrderedThreads>(mine, scan, &count);
#pragma unroll
    for (int k = 0; k < kPerThread; ++k)
      if (own[k]) positions[slot++] = static_cast<int32_t>(base + threadIdx.x * kPerThread + k);
    __syncthreads();
    for (int j = 0; j < count; ++j) {
      const int64_t t = positions[j], row = static_cast<int64_t>(ids[t]) - vocab_start;
      for (int64_t c = threadIdx.x; c < h; c += kOrderedThreads) dtable[row * h + c] += dout[t * h + c];
    }
    __syncthreads();  // positions are reused by the next chunk
  }
}
}  // namespace

void launch_embedding_fwd(FOut out, const int32_t* ids, FIn table, int64_t n, int64_t v, int64_t h,
                          int64_t vocab_start, cudaStream_t s) {
  if (n <= 0 || h <= 0) return;
  embedding_fwd_kernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(out, ids, table, v, h, vocab_start);
  MCPP_CUDA_LAUNCH_CHECK();
}
void launch_embedding_bwd(float* dtable, const int32_t* ids, FIn dout, int64_t n, int64_t v, int64_t h,
                          int64_t vocab_start, bool ordered, cudaStream_t s) {
  if (n <= 0 || h <= 0) return;
  if (ordered) {
    const auto owners = static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(v, 1), 1024));
    embedding_bwd_ordered_kernel<<<owners, kOrderedThreads, 0, s>>>(dtable, ids, dout, n, v, h, vocab_start);
    MCPP_CUDA_LAUNCH_CHECK();
    return;
  }
  embedding_bwd_kernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(dtable, ids, dout, v, h, vocab_start);
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
