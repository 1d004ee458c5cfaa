#include "mcpp/transformer/inference_context.h"

#include <algorithm>

#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {

InferenceContext::InferenceContext(int64_t batch_size, int64_t max_sequence_length, Device device)
    : batch_size_(batch_size), max_sequence_length_(max_sequence_length), device_(device) {
  MCPP_CHECK(batch_size > 0 && max_sequence_length > 0,
             "InferenceContext: batch size {} and max sequence length {} must be positive", batch_size,
             max_sequence_length);
}

void InferenceContext::set_lengths(const std::vector<int32_t>& lengths) {
  MCPP_CHECK(static_cast<int64_t>(lengths.size()) == batch_size_, "InferenceContext: {} lengths for {} sequences",
             lengths.size(), batch_size_);
  for (int32_t l : lengths)
    MCPP_CHECK(l > 0 && l <= max_sequence_length_, "InferenceContext: a sequence length {} outside [1, {}]", l,
               max_sequence_length_);
  lengths_ = lengths;
  Tensor host = Tensor::empty({batch_size_}, DType::I32);
  std::copy(lengths.begin(), lengths.end(), host.data<int32_t>());
  lengths_device_ = host.to(device_);
  started_ = true;
}

void InferenceContext::check_step(int64_t s, int64_t b) const {
  MCPP_CHECK(b == batch_size_, "InferenceContext: a forward of {} sequences; the context holds {}", b, batch_size_);
  if (prefill()) {
    MCPP_CHECK(s >= 1 && s <= max_sequence_length_, "InferenceContext: a prompt of {} tokens exceeds the cache's {}",
               s, max_sequence_length_);
    return;
  }
  MCPP_CHECK(s == 1, "InferenceContext: a decode step takes one token per sequence; got {}", s);
  for (size_t bb = 0; bb < lengths_.size(); ++bb)
    MCPP_CHECK(lengths_[bb] < max_sequence_length_, "InferenceContext: sequence {} fills the cache ({} tokens)", bb,
               max_sequence_length_);
}

InferenceContext::KeyValueMemory& InferenceContext::memory(const std::string& layer, const Tensor& k) {
  KeyValueMemory& m = memory_[layer];
  const Shape shape{max_sequence_length_, batch_size_, k.size(2), k.size(3)};  // [max_s, b, ng, d]
  if (!m.key.defined()) {
    m.key = Tensor::empty(shape, k.dtype(), device_);
    m.value = Tensor::empty(shape, k.dtype(), device_);
  }
  MCPP_CHECK(m.key.shape() == shape && m.key.dtype() == k.dtype(),
             "InferenceContext: layer {} keys {} do not fit its memory {}", layer, k.str(), m.key.str());
  return m;
}

Tensor InferenceContext::attend(const std::string& layer, const CoreAttention& core, CoreAttentionCtx& ctx,
                                const Tensor& q, const Tensor& k, const Tensor& v, float softmax_scale) {
  const int64_t s = q.size(0);
  check_step(s, q.size(1));
  KeyValueMemory& m = memory(layer, k);
  if (prefill()) {  // rows 0..s-1 of [max_s, b, ng, d] are the first s * b * ng * d elements: one copy each
    Tensor kr = m.key.narrow0(0, s), vr = m.value.narrow0(0, s);
    kr.copy_from(k);
    vr.copy_from(v);
    return core.forward(ctx, q, k, v, {.training = false});  // [s, b, nq, d], causal
  }
  ops::kv_cache_append(m.key, m.value, k, v, lengths_device_);
  Tensor context = Tensor::empty(q.shape(), q.dtype(), q.device());  // [1, b, nq, d]
  ops::kv_cache_attention(context, q, m.key, m.value, lengths_device_, softmax_scale);
  return context;
}

}  // namespace mcpp
