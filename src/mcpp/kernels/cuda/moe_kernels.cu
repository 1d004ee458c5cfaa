// Device code for moe.cpp (mixture-of-experts row movement; contracts in kernels/ops.inc).
//   permute:       one block per token t; threads copy x[t] into out[idx[t, i]] for each of its k routes.
//   unpermute:     one block per token; each thread owns columns and sums its k routes in route order (fp32).
//   unpermute_bwd: one block per route (t, i); threads write din[idx[t, i]] = w * dy[t] and a block sum gives
//                  dw[t, i] = dy[t] . in[idx[t, i]] (fp32).
//   topk_softmax / _bwd: one thread per token over its E logits (fp32 math; expf), the CPU's order of choices.
//   (permute / unpermute / unpermute_bwd have 8-wide forms with 16-byte accesses when the rows allow: vec8_ok;
//   an idx entry -1, a route dropped over capacity, moves nothing.)
//   capacity positions: the routes staged expert-major (from the dropless rows), then one block per expert over its
//                  own routes (moe_capacity_positions_kernel below).
//   route positions: counts — one block per expert, a block sum of its matches; positions — one block per
//                  expert walking the routes in chunks, a block-wide exclusive scan of the matches giving each its
//                  rank in token order (deterministic, as the CPU's serial walk).
#include <algorithm>

#include "mcpp/kernels/cuda/device_utils.cuh"

namespace mcpp::cuda_detail {
namespace {
constexpr int kThreads = 256;

__global__ void moe_permute_kernel(FOut out, FIn x, const int32_t* idx, int64_t k, int64_t h) {
  const int64_t t = blockIdx.x;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t j = idx[t * k + i];
    if (j < 0) continue;  // dropped
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x) out.set(j * h + c, x[t * h + c]);
  }
}

__global__ void moe_unpermute_kernel(FOut y, FIn in, const int32_t* idx, const float* w, int64_t k, int64_t h) {
  const int64_t t = blockIdx.x;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    float acc = 0.0f;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t j = idx[t * k + i];
      if (j < 0) continue;
      const float wi = w ? w[t * k + i] : 1.0f;
      acc += wi * in[j * h + c];
    }
    y.set(t * h + c, acc);
  }
}

__global__ void moe_unpermute_bwd_kernel(FOut din, float* dw, FIn dy, FIn in, const int32_t* idx, const float* w,
                                         int64_t k, int64_t h) {
  __shared__ float scratch[33];
  const int64_t route = blockIdx.x, t = route / k;
  const int64_t j = idx[route];
  if (j < 0) {  // dropped: no row, no weight gradient (the whole block returns)
    if (threadIdx.x == 0) dw[route] = 0.0f;
    return;
  }
  const float wi = w[route];
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    const float g = dy[t * h + c];
    dot += g * in[j * h + c];
    din.set(j * h + c, wi * g);
  }
  dot = block_sum(dot, scratch);
  if (threadIdx.x == 0) dw[route] = dot;
}
// 8-wide forms (vec8_ok: h % 8 == 0, 16-byte aligned rows): one thread per 8 columns of a row, threads over
// (row, column group) in a grid-stride loop, so a block is not tied to one h-wide row (h / 8 = 96 lanes at
// h 768). Same math and order per element as the scalar kernels (unpermute: routes summed in route order).
__global__ void moe_permute_vec8_kernel(FOut out, FIn x, const int32_t* idx, int64_t n, int64_t k, int64_t h8) {
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < n * h8;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = g / h8, c = g - t * h8;
    float v[8];
    load8(x, g, v);
    for (int64_t i = 0; i < k; ++i) {
      const int64_t j = idx[t * k + i];
      if (j >= 0) store8(out, j * h8 + c, v);
    }
  }
}

__global__ void moe_unpermute_vec8_kernel(FOut y, FIn in, const int32_t* idx, const float* w, int64_t n, int64_t k,
                                          int64_t h8) {
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < n * h8;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = g / h8, c = g - t * h8;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t i = 0; i < k; ++i) {
      const int64_t j = idx[t * k + i];
      if (j < 0) continue;
      const float wi = w ? w[t * k + i] : 1.0f;
      float v[8];
      load8(in, j * h8 + c, v);
#pragma unroll
      for (int q = 0; q < 8; ++q) acc[q] += wi * v[q];
    }
    store8(y, g, acc);
  }
}

// One block per route; the dot product dw = dy[t] . in[j] as the scalar kernel's (per-thread partial sums, then a
// block sum), over 8-column groups.
__global__ void moe_unpermute_bwd_vec8_kernel(FOut din, float* dw, FIn dy, FIn in, const int32_t* idx, const float* w,
                                              int64_t k, int64_t h8) {
  __shared__ float scratch[33];
  const int64_t route = blockIdx.x, t = route / k;
  const int64_t j = idx[route];
  if (j < 0) {
    if (threadIdx.x == 0) dw[route] = 0.0f;
    return;
  }
  const float wi = w[route];
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < h8; c += blockDim.x) {
    float g[8], v[8];
    load8(dy, t * h8 + c, g);
    load8(in, j * h8 + c, v);
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      dot += g[q] * v[q];
      g[q] *= wi;
    }
    store8(din, j * h8 + c, g);
  }
  dot = block_sum(dot, scratch);
  if (threadIdx.x == 0) dw[route] = dot;
}

unsigned grid_blocks(int64_t items) {  // grid-stride loops: at most 16 blocks of 256 threads an SM (132 SMs)
  return static_cast<unsigned>(std::min<int64_t>((items + kThreads - 1) / kThreads, 132 * 16));
}

constexpr int kTokThreads = 128;

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// The selection value of expert j for the group scores: the logit, the softmax score (pre_softmax) or the sigmoid.
__device__ __forceinline__ float group_value(const float* scores, FIn logits, int64_t t, int64_t e, int64_t j,
                                             const MoeTopkArgs& a) {
  if (a.sigmoid) return sigmoidf(logits[t * e + j]) + (a.expert_bias ? a.expert_bias[j] : 0.0f);
  return a.pre_softmax ? scores[t * e + j] : logits[t * e + j];
}

// Group-limited routing: the bit mask of the group_topk groups with the largest sums of their m = k / group_topk
// largest values (ties to the lower group; a group's m largest taken in (value desc, index asc) order).
__device__ uint64_t allowed_groups(const float* scores, FIn logits, int64_t t, int64_t e, int64_t k,
                                   const MoeTopkArgs& a) {
  const int64_t per = e / a.num_groups, m = k / a.group_topk;
  float gs[kMaxGroups];
  for (int64_t g = 0; g < a.num_groups; ++g) {
    float sum = 0.0f, prev_v = INFINITY;
    int64_t prev_j = -1;
    for (int64_t i = 0; i < m; ++i) {  // the largest below the previous pick in (value desc, index asc) order
      float bv = -INFINITY;
      int64_t bj = -1;
      for (int64_t j = g * per; j < (g + 1) * per; ++j) {
        const float v = group_value(scores, logits, t, e, j, a);
        const bool below = v < prev_v || (v == prev_v && j > prev_j);
        if (below && (bj < 0 || v > bv)) bv = v, bj = j;
      }
      sum += bv;
      prev_v = bv, prev_j = bj;
    }
    gs[g] = sum;
  }
  uint64_t chosen = 0;
  for (int64_t i = 0; i < a.group_topk; ++i) {
    int64_t best = -1;
    for (int64_t g = 0; g < a.num_groups; ++g)
      if (!((chosen >> g) & 1) && (best < 0 || gs[g] > gs[best])) best = g;
    chosen |= uint64_t{1} << best;
  }
  return chosen;
}

__global__ void moe_topk_softmax_kernel(int32_t* topk, float* probs, float* scores, float* lse, FIn logits, int64_t n,
                                        int64_t e, int64_t k, MoeTopkArgs a) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= n) return;
  if (a.sigmoid) {  // scores = the load-balancing loss's normalized sigmoid (k > 1), lse = its normalizer
    float z = 0.0f;
    for (int64_t j = 0; j < e; ++j) z += sigmoidf(logits[t * e + j]);
    z += 1e-20f;
    for (int64_t j = 0; j < e; ++j) {
      const float sj = sigmoidf(logits[t * e + j]);
      scores[t * e + j] = k > 1 ? sj / z : sj;
    }
    lse[t] = z;
  } else {
    float mx = -INFINITY;
    for (int64_t j = 0; j < e; ++j) mx = fmaxf(mx, logits[t * e + j]);
    float sum = 0.0f;
    for (int64_t j = 0; j < e; ++j) sum += expf(logits[t * e + j] - mx);
    for (int64_t j = 0; j < e; ++j) scores[t * e + j] = expf(logits[t * e + j] - mx) / sum;
    lse[t] = mx + logf(sum);
  }
  const uint64_t groups = a.num_groups > 0 ? allowed_groups(scores, logits, t, e, k, a) : ~uint64_t{0};
  const int64_t per = a.num_groups > 0 ? e / a.num_groups : e;
  int32_t* top = topk + t * k;
  float* pr = probs + t * k;
  for (int64_t i = 0; i < k; ++i) {  // k passes of max, ties to the lower expert
    int32_t best = -1;
    float bv = -INFINITY;
    for (int32_t j = 0; j < static_cast<int32_t>(e); ++j) {
      if (!((groups >> (j / per)) & 1)) continue;
      bool taken = false;
      for (int64_t q = 0; q < i && !taken; ++q) taken = top[q] == j;
      // the logit (every score function's order), or with an expert bias s + b, with a logit bias logit + lb
      const float v = a.expert_bias  ? sigmoidf(logits[t * e + j]) + a.expert_bias[j]
                      : a.logit_bias ? float(logits[t * e + j]) + a.logit_bias[j]
                                     : float(logits[t * e + j]);
      if (!taken && (best < 0 || v > bv)) best = j, bv = v;
    }
    top[i] = best;
    const float lb = logits[t * e + best];
    pr[i] = a.sigmoid ? sigmoidf(lb) : a.pre_softmax ? scores[t * e + best] : lb;
  }
  if (a.sigmoid && k > 1) {
    float zk = 0.0f;
    for (int64_t i = 0; i < k; ++i) zk += pr[i];
    for (int64_t i = 0; i < k; ++i) pr[i] = pr[i] / (zk + 1e-20f);
  } else if (!a.sigmoid && !a.pre_softmax) {  // softmax over the k chosen logits (pr[0] is their max)
    float s2 = 0.0f;
    for (int64_t i = 0; i < k; ++i) s2 += expf(pr[i] - pr[0]);
    const float m0 = pr[0];
    for (int64_t i = 0; i < k; ++i) pr[i] = expf(pr[i] - m0) / s2;
  }
}

__global__ void moe_topk_softmax_bwd_kernel(FOut dlogits, const float* dprobs, const float* probs, const int32_t* topk,
                                            const float* scores, const float* lse, const float* aux_grad0,
                                            int64_t aux_rows, int64_t n, int64_t e, int64_t k, MoeTopkArgs a,
                                            float z_coef) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= n) return;
  const float* aux_grad = aux_grad0 + (t % aux_rows) * e;  // the token's row (its sequence's, or the one row)
  const int32_t* top = topk + t * k;
  const float *pr = probs + t * k, *dp = dprobs + t * k, *s = scores + t * e;
  if (a.sigmoid) {  // s_j = scores * z (k > 1); ds by the two normalizations' Jacobians; dlogit = ds s (1 - s)
    const float z = lse[t];
    float ga = 0.0f, zk = 0.0f, dot = 0.0f;
    for (int64_t j = 0; j < e; ++j) ga += aux_grad[j] * s[j];
    for (int64_t i = 0; i < k; ++i) zk += k > 1 ? s[top[i]] * z : s[top[i]], dot += dp[i] * pr[i];
    for (int64_t j = 0; j < e; ++j) {
      float ds = k > 1 ? (aux_grad[j] - ga) / z : aux_grad[j];
      for (int64_t i = 0; i < k; ++i)
        if (top[i] == j) ds += k > 1 ? (dp[i] - dot) / (zk + 1e-20f) : dp[i];
      const float sj = k > 1 ? s[j] * z : s[j];
      dlogits.set(t * e + j, ds * sj * (1.0f - sj));
    }
    return;
  }
  const bool pre_softmax = a.pre_softmax;
  float sg = 0.0f, dot = 0.0f;  // <s, g>; sum_i p_i dp_i (the top-k softmax's)
  for (int64_t j = 0; j < e; ++j) sg += s[j] * aux_grad[j];
  for (int64_t i = 0; i < k; ++i) {
    if (pre_softmax) sg += s[top[i]] * dp[i];
    else dot += pr[i] * dp[i];
  }
  const float zl = z_coef * lse[t];
  for (int64_t j = 0; j < e; ++j) {
    float g = aux_grad[j], d = 0.0f;
    for (int64_t i = 0; i < k; ++i)
      if (top[i] == j) {
        if (pre_softmax) g += dp[i];
        else d += pr[i] * (dp[i] - dot);
      }
    dlogits.set(t * e + j, d + s[j] * (g - sg) + zl * s[j]);
  }
}

__global__ void moe_route_counts_kernel(int64_t* counts, const int32_t* topk, int64_t routes) {
  __shared__ long long scratch[33];
  const int32_t ex = static_cast<int32_t>(blockIdx.x);
  long long c = 0;
  for (int64_t q = threadIdx.x; q < routes; q += blockDim.x) c += topk[q] == ex ? 1 : 0;
  c = block_sum(c, scratch);
  if (threadIdx.x == 0) counts[ex] = c;
}

// counts [g, e] float32, zeroed before: each block histograms its stride of routes in shared memory (smem) or adds
// straight to the global counts (g * e too large for it); integer-valued float atomics, so the order is irrelevant.
__global__ void moe_route_counts_by_row_kernel(float* counts, const int32_t* topk, const int32_t* idx, int64_t routes,
                                               int64_t k, int64_t g, int64_t e, bool smem) {
  extern __shared__ unsigned int hist[];
  if (smem)
    for (int64_t q = threadIdx.x; q < g * e; q += blockDim.x) hist[q] = 0u;
  __syncthreads();
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < routes; r += int64_t(gridDim.x) * blockDim.x) {
    if ((idx && idx[r] < 0) || topk[r] < 0 || topk[r] >= e) continue;  // dropped (or not an expert): not counted
    const int64_t slot = (r / k) % g * e + topk[r];
    if (smem) atomicAdd(&hist[slot], 1u);
    else atomicAdd(&counts[slot], 1.0f);
  }
  if (!smem) return;
  __syncthreads();
  for (int64_t q = threadIdx.x; q < g * e; q += blockDim.x)
    if (hist[q] != 0u) atomicAdd(&counts[q], static_cast<float>(hist[q]));
}

constexpr int kScanThreads = 256, kScanPer = 4, kScanChunk = kScanThreads * kScanPer;

__global__ void __launch_bounds__(kScanThreads) moe_route_positions_kernel(int32_t* idx, const int64_t* counts,
                                                                           const int32_t* topk, int64_t routes) {
  __shared__ int32_t scan[kScanThreads];
  const int32_t ex = static_cast<int32_t>(blockIdx.x);
  int64_t base = 0;  // this expert's first row: the routes of the experts before it
  for (int32_t j = 0; j < ex; ++j) base += counts[j];
  for (int64_t start = 0; start < routes; start += kScanChunk) {
    int mine = 0;
#pragma unroll
    for (int p = 0; p < kScanPer; ++p) {
      const int64_t q = start + threadIdx.x * kScanPer + p;
      mine += (q < routes && topk[q] == ex) ? 1 : 0;
    }
    int total = 0;
    int64_t slot = base + block_exclusive_scan<kScanThreads>(mine, scan, &total);
#pragma unroll
    for (int p = 0; p < kScanPer; ++p) {
      const int64_t q = start + threadIdx.x * kScanPer + p;
      if (q < routes && topk[q] == ex) idx[q] = static_cast<int32_t>(slot++);
    }
    base += total;
  }
}
// The chunked form of the route positions (E <= kRpMaxExperts): the routes in chunks of kRpThreads, one a thread.
// (1) each chunk's per-expert counts; (2) one block: the experts' totals, and each (chunk, expert)'s first row =
// the routes of the experts before it + of the same expert in the chunks before; (3) each route's row = its chunk's
// offset + the same expert's routes in the warps before it (per-warp counts in shared memory) + in its warp before
// it (__match_any_sync). The same rows as one block per expert scanning every route, with the chunks in parallel.
constexpr int kRpThreads = 1024, kRpWarps = kRpThreads / 32, kRpMaxExperts = 256;

__global__ void __launch_bounds__(kRpThreads) moe_chunk_counts_kernel(int32_t* chunk_counts, const int32_t* topk,
                                                                      int64_t routes, int64_t e) {
  __shared__ int32_t hist[kRpMaxExperts];
  for (int64_t j = threadIdx.x; j < e; j += blockDim.x) hist[j] = 0;
  __syncthreads();
  const int64_t q = blockIdx.x * static_cast<int64_t>(kRpThreads) + threadIdx.x;
  if (q < routes && topk[q] >= 0 && topk[q] < e) atomicAdd(&hist[topk[q]], 1);  // (an invalid expert: no row)
  __syncthreads();
  for (int64_t j = threadIdx.x; j < e; j += blockDim.x) chunk_counts[blockIdx.x * e + j] = hist[j];
}

__global__ void __launch_bounds__(kRpMaxExperts) moe_chunk_offsets_kernel(int32_t* offsets, int64_t* counts,
                                                                          const int32_t* chunk_counts, int64_t chunks,
                                                                          int64_t e) {
  __shared__ int32_t scan[kRpMaxExperts];
  const int64_t j = threadIdx.x;
  int total = 0;
  if (j < e)
    for (int64_t c = 0; c < chunks; ++c) total += chunk_counts[c * e + j];
  int all = 0;
  int run = block_exclusive_scan<kRpMaxExperts>(j < e ? total : 0, scan, &all);
  if (j >= e) return;
  counts[j] = total;
  for (int64_t c = 0; c < chunks; ++c) {
    offsets[c * e + j] = run;
    run += chunk_counts[c * e + j];
  }
}

__global__ void __launch_bounds__(kRpThreads) moe_chunk_positions_kernel(int32_t* idx, const int32_t* offsets,
                                                                         const int32_t* topk, int64_t routes,
                                                                         int64_t e) {
  __shared__ int32_t wcnt[kRpWarps][kRpMaxExperts];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  for (int64_t q = threadIdx.x; q < kRpWarps * e; q += blockDim.x) wcnt[q / e][q % e] = 0;
  __syncthreads();
  const int64_t q = blockIdx.x * static_cast<int64_t>(kRpThreads) + threadIdx.x;
  const int ex = q < routes ? topk[q] : -1;
  const bool valid = ex >= 0 && ex < e;
  const unsigned peers = __match_any_sync(0xffffffffu, ex);
  const int rank = __popc(peers & ((1u << lane) - 1u));
  if (valid && rank == 0) wcnt[warp][ex] = __popc(peers);
  __syncthreads();
  if (!valid) return;
  int before = 0;
  for (int w = 0; w < warp; ++w) before += wcnt[w][ex];
  idx[q] = offsets[blockIdx.x * e + ex] + before + rank;
}

// A probability's order key: positive floats order as their bits; 0, negatives and NaN rank lowest.
__device__ __forceinline__ uint32_t prob_key(float p) { return p > 0.0f ? __float_as_uint(p) : 0u; }

// Expert-major staging of the routes (from moe_route_positions' dropless rows): keys[row] = the route's
// probability key, route[row] = the route — each expert's routes contiguous, in token order.
__global__ void moe_capacity_stage_kernel(uint32_t* keys, int32_t* route, const int32_t* idx, const float* probs,
                                          int64_t routes) {
  for (int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; q < routes;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t row = idx[q];
    keys[row] = prob_key(probs[q]);
    route[row] = static_cast<int32_t>(q);
  }
}

// One block per expert (ops.inc moe_capacity_positions) over its staged routes. Over capacity with the probs
// policy, the capacity-th largest key is found by a radix select (4 passes of 8 bits, a shared histogram each over
// the expert's routes); routes above it stay, and of those equal to it the first in token order until capacity is
// reached. The position policy treats every route as "equal": the first capacity stay. Then the kept routes get
// their rows in token order (a block scan per chunk, as route positions); idx[route] is overwritten (-1: dropped).
__global__ void __launch_bounds__(kScanThreads) moe_capacity_positions_kernel(int32_t* idx, int64_t* kept,
                                                                              const int64_t* counts,
                                                                              const uint32_t* keys,
                                                                              const int32_t* route, int64_t cap,
                                                                              bool by_probs, bool pad) {
  __shared__ int32_t scan[kScanThreads];
  __shared__ long long red[33];
  const int32_t ex = static_cast<int32_t>(blockIdx.x);
  const int64_t cnt = counts[ex];
  int64_t seg = 0, base = 0;  // the expert's staged routes [seg, seg + cnt); its first row in the output order
  for (int32_t j = 0; j < ex; ++j) {
    seg += counts[j];
    base += min(counts[j], cap);
  }
  if (pad) base = static_cast<int64_t>(ex) * cap;
  const uint32_t* key = keys + seg;
  const bool all = cnt <= cap;
  uint32_t thr = 0;
  long long ties = cap;  // routes at the threshold that may stay
  if (!all && by_probs) {  // radix select, 8 bits a pass: the digit where the count from the top reaches `need`
    static_assert(kScanThreads == 256, "one thread a digit");
    __shared__ int32_t hist[256];
    __shared__ uint32_t digit;
    __shared__ long long digit_above;
    uint32_t prefix = cap > 0 ? 0u : 0xFFFFFFFFu, mask = 0;  // capacity 0: a threshold above every key
    long long need = cap;  // of the keys matching prefix, the need-th largest (need <= their count)
    for (int shift = 24; shift >= 0 && cap > 0; shift -= 8) {
      hist[threadIdx.x] = 0;
      __syncthreads();
      for (int64_t j = threadIdx.x; j < cnt; j += blockDim.x)
        if ((key[j] & mask) == prefix) atomicAdd(&hist[(key[j] >> shift) & 255u], 1);
      __syncthreads();
      // thread t holds digit 255 - t: the exclusive scan is the count of the keys with a larger digit
      const int b = 255 - static_cast<int>(threadIdx.x), here = hist[b];
      int matching = 0;  // the keys matching prefix (unused)
      const long long above = block_exclusive_scan<kScanThreads>(here, scan, &matching);
      if (above < need && need <= above + here) digit = static_cast<uint32_t>(b), digit_above = above;
      __syncthreads();
      need -= digit_above;
      prefix |= digit << shift;
      mask |= 255u << shift;
      __syncthreads();  // hist, scan and digit are rewritten next pass
    }
    thr = prefix;
    long long above = 0;
    for (int64_t j = threadIdx.x; j < cnt; j += blockDim.x) above += key[j] > thr;
    ties = cap - block_sum(above, red);
  }
  long long tie_seen = 0, kept_seen = 0;  // over the chunks before this one
  for (int64_t start = 0; start < cnt; start += kScanChunk) {
    bool mine[kScanPer], gt[kScanPer], eq[kScanPer];
    int n_eq = 0;
#pragma unroll
    for (int p = 0; p < kScanPer; ++p) {
      const int64_t j = start + threadIdx.x * kScanPer + p;
      mine[p] = j < cnt;
      if (all) gt[p] = mine[p], eq[p] = false;
      else if (by_probs) gt[p] = mine[p] && key[j] > thr, eq[p] = mine[p] && key[j] == thr;
      else gt[p] = false, eq[p] = mine[p];
      n_eq += eq[p];
    }
    int eq_total = 0;
    long long eq_rank = tie_seen + block_exclusive_scan<kScanThreads>(n_eq, scan, &eq_total);
    bool keep[kScanPer];
    int n_keep = 0;
#pragma unroll
    for (int p = 0; p < kScanPer; ++p) {
      keep[p] = gt[p] || (eq[p] && eq_rank++ < ties);
      n_keep += keep[p];
    }
    int keep_total = 0;
    long long slot = base + kept_seen + block_exclusive_scan<kScanThreads>(n_keep, scan, &keep_total);
#pragma unroll
    for (int p = 0; p < kScanPer; ++p) {
      const int64_t j = start + threadIdx.x * kScanPer + p;
      if (mine[p]) idx[route[seg + j]] = keep[p] ? static_cast<int32_t>(slot++) : -1;
    }
    tie_seen += eq_total;
    kept_seen += keep_total;
  }
  if (threadIdx.x == 0) kept[ex] = min(cnt, cap);
}
}  // namespace

void launch_moe_capacity_positions(int32_t* idx, int64_t* kept, const int64_t* counts, const float* probs,
                                   uint32_t* keys, int32_t* route, int64_t routes, int64_t e, int64_t capacity,
                                   bool by_probs, bool pad, cudaStream_t s) {
  if (e <= 0) return;
  if (routes > 0) {
    moe_capacity_stage_kernel<<<grid_blocks(routes), kThreads, 0, s>>>(keys, route, idx, probs, routes);
    MCPP_CUDA_LAUNCH_CHECK();
  }
  moe_capacity_positions_kernel<<<static_cast<unsigned>(e), kScanThreads, 0, s>>>(idx, kept, counts, keys, route,
                                                                                   capacity, by_probs, pad);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_moe_topk_softmax(int32_t* topk, float* probs, float* scores, float* lse, FIn logits, int64_t n, int64_t e,
                             int64_t k, const MoeTopkArgs& a, cudaStream_t s) {
  if (n <= 0) return;
  const auto blocks = static_cast<unsigned>((n + kTokThreads - 1) / kTokThreads);
  moe_topk_softmax_kernel<<<blocks, kTokThreads, 0, s>>>(topk, probs, scores, lse, logits, n, e, k, a);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_moe_topk_softmax_bwd(FOut dlogits, const float* dprobs, const float* probs, const int32_t* topk,
                                 const float* scores, const float* lse, const float* aux_grad, int64_t aux_rows,
                                 int64_t n, int64_t e, int64_t k, const MoeTopkArgs& a, float z_coef, cudaStream_t s) {
  if (n <= 0) return;
  const auto blocks = static_cast<unsigned>((n + kTokThreads - 1) / kTokThreads);
  moe_topk_softmax_bwd_kernel<<<blocks, kTokThreads, 0, s>>>(dlogits, dprobs, probs, topk, scores, lse, aux_grad,
                                                             aux_rows, n, e, k, a, z_coef);
  MCPP_CUDA_LAUNCH_CHECK();
}

int64_t moe_route_positions_scratch(int64_t routes, int64_t e) {
  return e <= kRpMaxExperts && routes > 0 ? 2 * ((routes + kRpThreads - 1) / kRpThreads) * e : 0;
}

void launch_moe_route_positions(int32_t* idx, int64_t* counts, const int32_t* topk, int64_t routes, int64_t e,
                                int32_t* scratch, cudaStream_t s) {
  if (e <= 0) return;
  if (e <= kRpMaxExperts && routes > 0) {  // the chunked form: chunk counts, offsets, rows
    const int64_t chunks = (routes + kRpThreads - 1) / kRpThreads;
    int32_t *chunk_counts = scratch, *offsets = scratch + chunks * e;
    moe_chunk_counts_kernel<<<static_cast<unsigned>(chunks), kRpThreads, 0, s>>>(chunk_counts, topk, routes, e);
    MCPP_CUDA_LAUNCH_CHECK();
    moe_chunk_offsets_kernel<<<1, kRpMaxExperts, 0, s>>>(offsets, counts, chunk_counts, chunks, e);
    MCPP_CUDA_LAUNCH_CHECK();
    moe_chunk_positions_kernel<<<static_cast<unsigned>(chunks), kRpThreads, 0, s>>>(idx, offsets, topk, routes, e);
    MCPP_CUDA_LAUNCH_CHECK();
    return;
  }
  moe_route_counts_kernel<<<static_cast<unsigned>(e), 256, 0, s>>>(counts, topk, routes);
  MCPP_CUDA_LAUNCH_CHECK();
  if (routes <= 0) return;
  moe_route_positions_kernel<<<static_cast<unsigned>(e), kScanThreads, 0, s>>>(idx, counts, topk, routes);
  MCPP_CUDA_LAUNCH_CHECK();
}

// Megatron's sinkhorn in one thread block of rows * e threads (rows = 1024 / e): thread (r, j) owns column j for rows
// r, r + rows, ...; the row pass gives each thread whole rows. cost = exp(logits) once, into the scratch. Every sum
// in a fixed order (deterministic).
__global__ void __launch_bounds__(1024) moe_sinkhorn_kernel(float* log_d1, float* d0, float* cost, const float* logits,
                                                             int64_t n, int64_t e, float tol, int max_iter) {
  extern __shared__ float sm[];  // d1 [e], then the column partials [blockDim]
  float* d1 = sm;
  float* part = sm + e;
  __shared__ float error;
  const int64_t tid = threadIdx.x, rows = blockDim.x / e, col = tid % e, row0 = tid / e;
  constexpr float eps = 1e-8f;
  for (int64_t j = tid; j < e; j += blockDim.x) d1[j] = 1.0f;
  for (int64_t q = tid; q < n * e; q += blockDim.x) cost[q] = expf(logits[q]);
  __syncthreads();
  for (int it = 0; it < max_iter; ++it) {
    for (int64_t t = tid; t < n; t += blockDim.x) {  // d0 = (1 / n) / (cost d1 + eps)
      float sum = 0.0f;
      for (int64_t j = 0; j < e; ++j) sum += d1[j] * cost[t * e + j];
      d0[t] = 1.0f / float(n) / (sum + eps);
    }
    __syncthreads();  // d0 (global) visible to the block
    float acc = 0.0f;  // (cost^T d0)[col] over this thread's rows
    if (row0 < rows)
      for (int64_t t = row0; t < n; t += rows) acc += d0[t] * cost[t * e + col];
    part[tid] = acc;
    __syncthreads();
    float diff = 0.0f;
    if (tid < e) {
      float total = 0.0f;
      for (int64_t r = 0; r < rows; ++r) total += part[r * e + tid];
      const float next = 1.0f / float(e) / (total + eps);
      diff = fabsf(next - d1[tid]);
      d1[tid] = next;
    }
    __syncthreads();
    part[tid] = diff;
    __syncthreads();
    if (tid == 0) {
      float sum = 0.0f;
      for (int64_t j = 0; j < e; ++j) sum += part[j];
      error = sum / float(e);
    }
    __syncthreads();
    if (!(error > tol)) break;  // Megatron's `while error > tol` (NaN stops it); uniform over the block
  }
  for (int64_t j = tid; j < e; j += blockDim.x) log_d1[j] = logf(d1[j]);
}

void launch_moe_sinkhorn(float* log_d1, float* d0, float* cost, const float* logits, int64_t n, int64_t e, float tol,
                         int max_iter, cudaStream_t s) {
  if (e <= 0) return;
  const auto threads = static_cast<unsigned>((1024 / e) * e);
  const size_t smem = static_cast<size_t>(e + threads) * sizeof(float);
  moe_sinkhorn_kernel<<<1, threads, smem, s>>>(log_d1, d0, cost, logits, n, e, tol, n > 0 ? max_iter : 0);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_moe_route_counts(float* counts, const int32_t* topk, const int32_t* idx, int64_t routes, int64_t k,
                             int64_t g, int64_t e, cudaStream_t s) {
  if (g * e <= 0) return;
  MCPP_CUDA_CHECK_RT(cudaMemsetAsync(counts, 0, static_cast<size_t>(g * e) * sizeof(float), s));
  if (routes <= 0) return;
  const size_t smem_bytes = static_cast<size_t>(g * e) * sizeof(unsigned int);
  const bool smem = smem_bytes <= 32 * 1024;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((routes + kThreads - 1) / kThreads, 132));
  moe_route_counts_by_row_kernel<<<blocks, kThreads, smem ? smem_bytes : 0, s>>>(counts, topk, idx, routes, k, g, e,
                                                                                 smem);
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_moe_permute(FOut out, FIn x, const int32_t* idx, int64_t n, int64_t k, int64_t h, cudaStream_t s) {
  if (n <= 0 || k <= 0 || h <= 0) return;
  if (vec8_ok(h, {out.p, x.p})) {
    moe_permute_vec8_kernel<<<grid_blocks(n * h / 8), kThreads, 0, s>>>(out, x, idx, n, k, h / 8);
  } else {
    moe_permute_kernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(out, x, idx, k, h);
  }
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_moe_unpermute(FOut y, FIn in, const int32_t* idx, const float* w, int64_t n, int64_t k, int64_t h,
                          cudaStream_t s) {
  if (n <= 0 || h <= 0) return;
  if (vec8_ok(h, {y.p, in.p})) {
    moe_unpermute_vec8_kernel<<<grid_blocks(n * h / 8), kThreads, 0, s>>>(y, in, idx, w, n, k, h / 8);
  } else {
    moe_unpermute_kernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(y, in, idx, w, k, h);
  }
  MCPP_CUDA_LAUNCH_CHECK();
}

void launch_moe_unpermute_bwd(FOut din, float* dw, FIn dy, FIn in, const int32_t* idx, const float* w, int64_t n,
                              int64_t k, int64_t h, cudaStream_t s) {
  if (n <= 0 || k <= 0) return;
  if (vec8_ok(h, {din.p, dy.p, in.p})) {
    const int threads = h / 8 >= 128 ? 128 : 64;  // one 8-column group per thread at h <= 1024
    moe_unpermute_bwd_vec8_kernel<<<static_cast<unsigned>(n * k), threads, 0, s>>>(din, dw, dy, in, idx, w, k, h / 8);
  } else {
    moe_unpermute_bwd_kernel<<<static_cast<unsigned>(n * k), kThreads, 0, s>>>(din, dw, dy, in, idx, w, k, h);
  }
  MCPP_CUDA_LAUNCH_CHECK();
}

}  // namespace mcpp::cuda_detail
