// CUDA kv_cache_append / kv_cache_attention (ops.inc; semantics of kernels/cpu/kv_cache.cpp): the KV cache of
// generation, the caches [cap, b, ng, d] and the step's tensors float32 or bf16 (the append: the step's k / v of the
// caches' dtype; the attention: each tensor may differ, math float32), lengths int32 [b] on the device — read by the
// kernels, so the host never syncs: the caller (InferenceContext) keeps lengths[bb] + sq <= cap; an append's rows
// past the cache are not written, the attention reads no key past it. Head dim: a multiple of 8 up to 256 (the
// attention's lanes hold 8 columns each at most). Asynchronous on stream_of(stream) (kv_cache_kernels.cu).
#include "mcpp/kernels/cuda/cuda_check.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cuda {
using namespace cuda_detail;

namespace {
KvShape checked(const char* op, const Tensor& step, const Tensor& k_cache, const Tensor& v_cache,
                const Tensor& lengths) {
  const KvCacheShape a = check_kv_cache(op, step, k_cache, v_cache, lengths);
  require_i32(op, "lengths", lengths);
  MCPP_CHECK(a.d > 0 && a.d % 8 == 0 && a.d <= 256, "{}: head dim d must be a multiple of 8 up to 256 on CUDA; got {}",
             op, step.str());
  MCPP_CHECK(a.b * a.nq <= (int64_t{1} << 31) - 1 && a.sq <= 65535, "{}: {} exceeds the launch grid", op, step.str());
  return {a.sq, a.b, a.nq, a.ng, a.d, a.cap};
}
}  // namespace

void kv_cache_append(Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v, const Tensor& lengths,
                     Stream stream) {
  const char* op = "kv_cache_append";
  const KvShape a = checked(op, k, k_cache, v_cache, lengths);
  MCPP_CHECK(a.nq == a.ng, "{}: k must hold the cache's {} groups; got {}", op, a.ng, k.str());
  require_same_shape(op, "v", v, "k", k);
  MCPP_CHECK(k.dtype() == k_cache.dtype() && v.dtype() == k_cache.dtype(),
             "{}: k {} and v {} must have the caches' dtype ({})", op, k.str(), v.str(), k_cache.str());
  launch_kv_cache_append(fout_of(op, "k_cache", k_cache), fout_of(op, "v_cache", v_cache), fin_of(op, "k", k),
                         fin_of(op, "v", v), lengths.data<int32_t>(), a, stream_of(stream));
}

void kv_cache_attention(Tensor& o, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& lengths, float softmax_scale, Stream stream) {
  const char* op = "kv_cache_attention";
  const KvShape a = checked(op, q, k_cache, v_cache, lengths);
  require_same_shape(op, "o", o, "q", q);
  launch_kv_cache_attention(fout_of(op, "o", o), fin_of(op, "q", q), fin_of(op, "k_cache", k_cache),
                            fin_of(op, "v_cache", v_cache), lengths.data<int32_t>(), softmax_scale, a,
                            stream_of(stream));
}

}  // namespace mcpp::ops::cuda
