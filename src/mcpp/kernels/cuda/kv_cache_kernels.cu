// Device code for kv_cache.cpp (ops.inc kv_cache_append / kv_cache_attention): the KV cache of generation.
//   append: one thread per element of k / v [sq, b, ng, d]; token i of sequence bb goes to cache row lengths[bb] + i
//     (rows >= cap are skipped: the host keeps the lengths in range, the kernel never writes past the cache).
//   attention (a decode step: sq queries, usually 1, against up to cap cached keys): grid b * nq heads x sq queries,
//     4 warps a block. Lane l holds the query's columns l, l + 32, .. (up to 8: d <= 256) scaled by the softmax
//     scale; warp w takes keys w, w + 4, ..: the dot product over its lanes (coalesced loads of the key
//     row), a butterfly sum, then the online softmax (running max m, sum l) and the value row accumulated in the
//     lanes' columns. The 4 warps' (m, l, acc) merge in shared memory: o = sum_w acc_w e^(m_w - M) / sum_w l_w
//     e^(m_w - M). Math float32; q / caches / o float32 or bf16.
#include "mcpp/kernels/cuda/device_utils.cuh"

namespace mcpp::cuda_detail {
namespace {
constexpr int kWarps = 4, kMaxCols = 8;  // columns a lane: d <= 32 * 8

__global__ void kv_cache_append_kernel(FOut k_cache, FOut v_cache, FIn k, FIn v, const int32_t* lengths, KvShape a,
                                       int64_t total) {
  const int64_t row = a.ng * a.d;  // one token of one sequence
  MCPP_GRID_STRIDE(e, total) {     // e over [sq, b, ng, d]
    const int64_t i = e / (a.b * row), bb = (e / row) % a.b, c = e % row;
    const int64_t dst_row = lengths[bb] + i;
    if (dst_row >= a.cap) continue;
    const int64_t dst = (dst_row * a.b + bb) * row + c;
    k_cache.set(dst, k[e]);
    v_cache.set(dst, v[e]);
  }
}

__global__ void __launch_bounds__(kWarps * 32) kv_cache_attention_kernel(FOut o, FIn q, FIn k_cache, FIn v_cache,
                                                                          const int32_t* lengths, float scale,
                                                                          KvShape a) {
  __shared__ float s_m[kWarps], s_l[kWarps];
  __shared__ float s_acc[kWarps][kMaxCols * 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t bb = blockIdx.x / a.nq, h = blockIdx.x % a.nq, g = h / (a.nq / a.ng), i = blockIdx.y;
  const int64_t qrow = ((i * a.b + bb) * a.nq + h) * a.d;
  const int64_t n_keys = min(static_cast<int64_t>(lengths[bb]) + i + 1, a.cap);
  float qv[kMaxCols], acc[kMaxCols];
#pragma unroll
  for (int c = 0; c < kMaxCols; ++c) {
    const int64_t col = lane + 32 * c;
    qv[c] = col < a.d ? q[qrow + col] * scale : 0.0f;
    acc[c] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = warp; j < n_keys; j += kWarps) {  // warp-uniform
    const int64_t krow = ((j * a.b + bb) * a.ng + g) * a.d;
    float dot = 0.0f;
#pragma unroll
    for (int c = 0; c < kMaxCols; ++c)
      if (lane + 32 * c < a.d) dot += qv[c] * k_cache[krow + lane + 32 * c];
    dot = warp_sum(dot);
    const float mn = fmaxf(m, dot);
    const float corr = __expf(m - mn), p = __expf(dot - mn);
    l = l * corr + p;
    m = mn;
#pragma unroll
    for (int c = 0; c < kMaxCols; ++c)
      if (lane + 32 * c < a.d) acc[c] = acc[c] * corr + p * v_cache[krow + lane + 32 * c];
  }
  if (lane == 0) s_m[warp] = m, s_l[warp] = l;
#pragma unroll
  for (int c = 0; c < kMaxCols; ++c) s_acc[warp][lane + 32 * c] = acc[c];
  __syncthreads();
  float mx = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, s_m[w]);
  float wt[kWarps], den = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    wt[w] = s_m[w] == -INFINITY ? 0.0f : __expf(s_m[w] - mx);  // a warp without keys weighs nothing
    den += s_l[w] * wt[w];
  }
  for (int64_t col = threadIdx.x; col < a.d; col += blockDim.x) {
    float num = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) num += s_acc[w][col] * wt[w];
    o.set(qrow + col, den > 0.0f ? num / den : 0.0f);
  }
}
}  // namespace

void launch_kv_cache_append(FOut k_cache, FOut v_cache, FIn k, FIn v, const int32_t* lengths, const KvShape& a,
                            cudaStream_t s) {
  const int64_t total = a.sq * a.b * a.ng * a.d;
  if (total <= 0) return;
  kv_cache_append_kernel<<<grid_for(total, 256), 256, 0, s>>>(k_cache, v_cache, k, v, lengths, a, total);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_kv_cache_attention(FOut o, FIn q, FIn k_cache, FIn v_cache, const int32_t* lengths, float scale,
                               const KvShape& a, cudaStream_t s) {
  if (a.sq <= 0 || a.b * a.nq <= 0) return;
  const dim3 grid(static_cast<unsigned>(a.b * a.nq), static_cast<unsigned>(a.sq));
  kv_cache_attention_kernel<<<grid, kWarps * 32, 0, s>>>(o, q, k_cache, v_cache, lengths, scale, a);
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
