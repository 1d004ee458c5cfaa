// Philox-4x32-10 on the device, bit for bit core/rng.h's philox4x32_10 (counter_hi = 0) and
// philox_uniform: the CUDA dropout kernels (activations_kernels.cu) and the attention kernels' in-tile
// dropout (attention_*kernels.cu) draw the numbers the CPU backend draws for the same key.
//   AttnDropout: the attention dropout mask of ops::AttentionOptions — element (bb, h, i, j) of the
//   [b, nq, s, s] probabilities, flat index ((bb nq + h) s + i) s + j, is kept iff the uniform of word
//   idx % 4 of counter offset + idx / 4 is >= p; keep() returns 1 / (1 - p) or 0. A call placed in a longer
//   sequence's mask (AttentionOptions::dropout_seq_length) indexes that mask: s -> drop_s, i -> i + drop_i0,
//   j -> j + drop_j0. `from` reads a CUDA-graph key's device base once per thread (core/rng.h); elements of one
//   counter share a Philox call in pair().
//   When aligned (drop_s % 4 == 0 and drop_j0 % 4 == 0) a counter's 4 words are 4 consecutive keys of one query
//   row, key % 4 = word, and the mma fragments' lanes share calls (one Philox per thread per 8-column block, words
//   exchanged by shuffles):
//   rows():    row-major C fragment (rows g, g + 8; keys 2t, 2t + 1): lanes t and t ^ 1 split a counter.
//   columns(): transposed fragment (rows = 16 keys, lane group of 4 keys 4 apart in lane id; columns = 2
//              queries): the 4 lanes of a key group each draw one of the 4 counters, then a 4x4 word transpose.
//   Every lane of the warp must call them together (shuffles).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "mcpp/kernels/cuda/launch.h"

namespace mcpp::cuda_detail {

__device__ __forceinline__ uint4 philox4x32_10(uint64_t seed, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c1 = lo1;
    c3 = lo0;
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return make_uint4(c0, c1, c2, c3);
}

__device__ __forceinline__ float philox_uniform(uint32_t w) {
  return static_cast<float>(w >> 8) * (1.0f / 16777216.0f);
}

__device__ __forceinline__ uint32_t philox_word(const uint4& r, uint32_t lane) {
  return lane == 0 ? r.x : lane == 1 ? r.y : lane == 2 ? r.z : r.w;
}

// The word of flat element idx of the stream at (seed, offset): word idx % 4 of counter offset + idx / 4
// (core/rng.h's philox_uniform_at before the conversion to a uniform).
__device__ __forceinline__ uint32_t philox_word_at(uint64_t seed, uint64_t offset, uint64_t idx) {
  return philox_word(philox4x32_10(seed, offset + idx / 4), static_cast<uint32_t>(idx % 4));
}

// The words of the 8 flat elements 8 j8 .. 8 j8 + 7 (counters offset + 2 j8 and + 1): the 16-byte dropout paths.
__device__ __forceinline__ void philox_words8(uint64_t seed, uint64_t offset, uint64_t j8, uint32_t (&w)[8]) {
  const uint4 r0 = philox4x32_10(seed, offset + 2 * j8), r1 = philox4x32_10(seed, offset + 2 * j8 + 1);
  w[0] = r0.x, w[1] = r0.y, w[2] = r0.z, w[3] = r0.w, w[4] = r1.x, w[5] = r1.y, w[6] = r1.z, w[7] = r1.w;
}

struct AttnDropout {
  float p, keep_scale;
  uint64_t seed, offset;

  __device__ static AttnDropout from(const AttnShape& a) {
    return {a.drop_p, 1.0f / (1.0f - a.drop_p), a.drop_seed, a.drop_offset + (a.drop_base ? *a.drop_base : 0)};
  }
  // Flat index of (bb, h, i, j) in the [b, nq, S, S] mask (S = a.drop_s; the block at rows drop_i0, keys drop_j0).
  __device__ static uint64_t index(const AttnShape& a, int64_t bb, int64_t h, int64_t i, int64_t j) {
    return static_cast<uint64_t>(((bb * a.nq + h) * a.drop_s + i + a.drop_i0) * a.drop_s + j + a.drop_j0);
  }
  __device__ float keep(uint64_t idx) const { return gate(philox_word_at(seed, offset, idx)); }
  __device__ float gate(uint32_t w) const { return philox_uniform(w) >= p ? keep_scale : 0.0f; }
  // Elements idx and idx + 1 (one Philox call unless they straddle a counter).
  __device__ float2 pair(uint64_t idx) const {
    const uint32_t lane = static_cast<uint32_t>(idx % 4);
    const uint4 r = philox4x32_10(seed, offset + idx / 4);
    const float z0 = philox_uniform(philox_word(r, lane)) >= p ? keep_scale : 0.0f;
    const float z1 = lane < 3 ? (philox_uniform(philox_word(r, lane + 1)) >= p ? keep_scale : 0.0f) : keep(idx + 1);
    return make_float2(z0, z1);
  }
  // z[2 hh + c] for elements idx_row0 + c (hh = 0) and idx_row1 + c (hh = 1), c = 0, 1, of a row-major mma C
  // fragment (keys 2t, 2t + 1 with t = lane % 4). Needs the aligned case (then idx % 4 = key % 4).
  __device__ void rows(float (&z)[4], uint64_t idx_row0, uint64_t idx_row1) const {
    const bool odd = threadIdx.x & 1;  // t odd: keys 2, 3 of the counter; t even: keys 0, 1
    const uint4 r = philox4x32_10(seed, offset + (odd ? idx_row1 : idx_row0) / 4);  // even: row 0's; odd: row 1's
    const uint32_t rx = __shfl_xor_sync(0xffffffffu, odd ? r.x : r.z, 1);
    const uint32_t ry = __shfl_xor_sync(0xffffffffu, odd ? r.y : r.w, 1);
    z[0] = gate(odd ? rx : r.x);
    z[1] = gate(odd ? ry : r.y);
    z[2] = gate(odd ? r.z : rx);
    z[3] = gate(odd ? r.w : ry);
  }
  // The fragments' entry points: the shared-counter forms when aligned (AttnShape::drop_aligned), else one call per
  // pair / element. s: the mask's row stride (AttnShape::drop_s).
  __device__ void fragment_rows(float (&z)[4], uint64_t idx_row0, uint64_t idx_row1, bool aligned) const {
    if (aligned) return rows(z, idx_row0, idx_row1);
    const float2 z0 = pair(idx_row0), z1 = pair(idx_row1);
    z[0] = z0.x, z[1] = z0.y, z[2] = z1.x, z[3] = z1.y;
  }
  __device__ void fragment_columns(float (&z)[4], uint64_t idx_q_kb, int64_t s, bool aligned) const {
    if (aligned) return columns(z, idx_q_kb, s);
    const uint64_t mine = idx_q_kb + ((threadIdx.x >> 2) & 3);  // (q, this lane's key)
#pragma unroll
    for (int e = 0; e < 4; ++e) z[e] = keep(mine + (e & 1) * static_cast<uint64_t>(s) + (e >> 1) * 8);
  }
  // z[e] for the element (query q + (e & 1), key kb + j + 8 (e >> 1)) of a transposed fragment, j = lane / 4 % 4;
  // idx_q_kb = flat index of (q, kb) with kb % 4 == 0; s = the mask's row stride. Needs the aligned case.
  __device__ void columns(float (&z)[4], uint64_t idx_q_kb, int64_t s) const {
    const uint32_t j = (threadIdx.x >> 2) & 3;
    const uint64_t mine = idx_q_kb + (j & 1) * static_cast<uint64_t>(s) + (j >> 1) * 8;  // counter e = j
    const uint4 r = philox4x32_10(seed, offset + mine / 4);
    uint32_t w[4];
    w[0] = w[1] = w[2] = w[3] = philox_word(r, j);  // word j of counter j (element e = j)
#pragma unroll
    for (uint32_t x = 1; x < 4; ++x) {  // from lane j ^ x: word j of its counter j ^ x (element e = j ^ x)
      const uint32_t got = __shfl_xor_sync(0xffffffffu, philox_word(r, j ^ x), x << 2);
#pragma unroll
      for (uint32_t e = 0; e < 4; ++e)
        if (e == (j ^ x)) w[e] = got;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) z[e] = gate(w[e]);
  }
};

}  // namespace mcpp::cuda_detail
