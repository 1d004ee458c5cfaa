// The KV cache ops of generation (ops.inc kv_cache_append / kv_cache_attention), the CPU reference:
//   kv_cache_append: k/v [sq, b, ng, d] -> rows lengths[bb] + i of k_cache / v_cache [cap, b, ng, d] (float32).
//   kv_cache_attention: q [sq, b, nq, d] against the cache, query i of sequence bb over keys j <= lengths[bb] + i
//     -> o [sq, b, nq, d]: scores in float32 (dot products in order over d), the softmax max-subtracted, its sum and
//     the output accumulated in float32 over the keys in order. lengths: int32 [b] on the host.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "mcpp/kernels/cpu/checks.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cpu {

namespace {
void require_kv_f32(const char* op, const Tensor& step, const Tensor& k_cache, const Tensor& v_cache) {
  detail::require_cpu_f32(op, "the step's tensor", step);
  detail::require_cpu_f32(op, "k_cache", k_cache);
  detail::require_cpu_f32(op, "v_cache", v_cache);
}

// lengths[bb] + rows <= cap for every sequence (the step's rows fit the cache).
void require_room(const char* op, const int32_t* len, const KvCacheShape& a) {
  for (int64_t bb = 0; bb < a.b; ++bb)
    MCPP_CHECK(len[bb] >= 0 && len[bb] + a.sq <= a.cap,
               "{}: sequence {} holds {} cached rows; {} more exceed the cache's capacity {}", op, bb, len[bb], a.sq,
               a.cap);
}
}  // namespace

void kv_cache_append(Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v, const Tensor& lengths,
                     Stream) {
  const char* op = "kv_cache_append";
  const KvCacheShape a = check_kv_cache(op, k, k_cache, v_cache, lengths);
  MCPP_CHECK(a.nq == a.ng, "{}: k must hold the cache's {} groups; got {}", op, a.ng, k.str());
  detail::require_same_shape(op, "v", v, "k", k);
  require_kv_f32(op, k, k_cache, v_cache);
  detail::require_cpu_f32(op, "v", v);
  const int32_t* len = lengths.data<int32_t>();
  require_room(op, len, a);
  const int64_t row = a.ng * a.d;  // one token of one sequence
  for (int64_t i = 0; i < a.sq; ++i)
    for (int64_t bb = 0; bb < a.b; ++bb) {
      const int64_t dst = ((len[bb] + i) * a.b + bb) * row, src = (i * a.b + bb) * row;
      std::memcpy(k_cache.data<float>() + dst, k.data<float>() + src, sizeof(float) * static_cast<size_t>(row));
      std::memcpy(v_cache.data<float>() + dst, v.data<float>() + src, sizeof(float) * static_cast<size_t>(row));
    }
}

void kv_cache_attention(Tensor& o, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& lengths, float softmax_scale, Stream) {
  const char* op = "kv_cache_attention";
  const KvCacheShape a = check_kv_cache(op, q, k_cache, v_cache, lengths);
  detail::require_same_shape(op, "o", o, "q", q);
  require_kv_f32(op, q, k_cache, v_cache);
  detail::require_cpu_f32(op, "o", o);
  const int32_t* len = lengths.data<int32_t>();
  for (int64_t bb = 0; bb < a.b; ++bb)
    MCPP_CHECK(len[bb] >= 0 && len[bb] + a.sq <= a.cap,
               "{}: sequence {}: {} cached rows + {} queries exceed the cache's capacity {}", op, bb, len[bb], a.sq,
               a.cap);
  const int64_t r = a.nq / a.ng;
  const float* pq = q.data<float>();
  const float* pk = k_cache.data<float>();
  const float* pv = v_cache.data<float>();
  float* po = o.data<float>();
#pragma omp parallel for schedule(dynamic) if (a.sq * a.b * a.nq * a.cap * a.d > (1 << 16))
  for (int64_t row = 0; row < a.sq * a.b * a.nq; ++row) {  // row = (i * b + bb) * nq + h
    const int64_t i = row / (a.b * a.nq), bb = (row / a.nq) % a.b, h = row % a.nq, g = h / r;
    const int64_t n = len[bb] + i + 1;  // keys 0 .. lengths[bb] + i
    const float* qi = pq + row * a.d;
    std::vector<float> sc(static_cast<size_t>(n));
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      const float* kj = pk + ((j * a.b + bb) * a.ng + g) * a.d;
      float dot = 0.0f;
      for (int64_t t = 0; t < a.d; ++t) dot += qi[t] * kj[t];
      sc[static_cast<size_t>(j)] = dot * softmax_scale;
      mx = std::max(mx, sc[static_cast<size_t>(j)]);
    }
    float* oi = po + row * a.d;
    std::fill(oi, oi + a.d, 0.0f);
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      const float p = std::exp(sc[static_cast<size_t>(j)] - mx);
      sum += p;
      const float* vj = pv + ((j * a.b + bb) * a.ng + g) * a.d;
      for (int64_t t = 0; t < a.d; ++t) oi[t] += p * vj[t];
    }
    for (int64_t t = 0; t < a.d; ++t) oi[t] /= sum;
  }
}

}  // namespace mcpp::ops::cpu
