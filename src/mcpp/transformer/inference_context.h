// InferenceContext (Megatron-Core inference/contexts/static_context.py, StaticInferenceContext — the former
// InferenceParams): the key/value memory of KV-cache generation, passed to a forward through
// ForwardOptions::inference. One per generation of b sequences; a forward with it runs in one of two forms:
//   prefill (nothing cached yet): tokens [s, b], the prompts right-padded to s. Each attention layer runs its usual
//     causal core attention over the s rows and stores its keys / values (after RoPE, the qk norms, MLA's
//     up-projections) in rows 0..s-1 of its memory — the pad rows too: they sit at or past a sequence's length, so
//     its later tokens overwrite them before any query reads them (a real row never attends to a pad: causal).
//   decode (rows cached): tokens [1, b], token bb at position lengths[bb] (ragged per sequence): each attention layer
//     appends its key / value at row lengths[bb] (ops::kv_cache_append) and attends over rows 0..lengths[bb]
//     (ops::kv_cache_attention: one query against the cache, not an [s, s] square). Positions — learned absolute
//     embeddings and RoPE rows — are lengths[bb]: GPTModel gathers those rows of the tables (one per sequence) and
//     the attention modules apply RoPE to the step's [1, b] rows viewed as [b, 1].
//   After each forward the caller records the new lengths (the prompts' lengths after the prefill, + 1 per decode).
// Memory: per attention layer (keyed by its parameter prefix; Megatron keys it by layer_number) key and value
// [max_sequence_length, b, groups, head dim] in the activations' dtype on the model's device, allocated on the layer's
// first use. MLA caches its full per-head key / value after the up-projections (zero-padded to the common head dim:
// no absorbed / latent cache). Tensor / context / pipeline parallelism: not supported (generation runs one rank).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "mcpp/core/tensor.h"
#include "mcpp/transformer/dot_product_attention.h"

namespace mcpp {

class InferenceContext {
 public:
  // b sequences of at most max_sequence_length tokens (prompt + generated) each, memory on `device`.
  InferenceContext(int64_t batch_size, int64_t max_sequence_length, Device device);

  int64_t batch_size() const { return batch_size_; }
  int64_t max_sequence_length() const { return max_sequence_length_; }
  bool prefill() const { return !started_; }  // the next forward is the prompt's prefill
  // The rows cached per sequence (host), and the same as int32 [b] on the device: the decode step's positions.
  const std::vector<int32_t>& lengths() const { return lengths_; }
  const Tensor& lengths_tensor() const { return lengths_device_; }
  // After a forward: the rows now cached per sequence (> 0, <= max_sequence_length). Uploads them.
  void set_lengths(const std::vector<int32_t>& lengths);
  // mcpp::Error unless a forward of s tokens per sequence fits: s rows (prefill: s <= max_sequence_length, b
  // sequences) or one more row each (decode: s == 1, lengths[bb] < max_sequence_length).
  void check_step(int64_t s, int64_t b) const;

  // The cached core attention of one layer (`layer`: its parameter prefix), q [s, b, nq, d], k / v [s, b, ng, d] ->
  // context [s, b, nq, d]: prefill: the keys / values stored, then `core`'s causal forward (ctx: its context);
  // decode: appended, then the attention of the step's queries over the cache (softmax_scale: the core's).
  Tensor attend(const std::string& layer, const CoreAttention& core, CoreAttentionCtx& ctx, const Tensor& q,
                const Tensor& k, const Tensor& v, float softmax_scale);

 private:
  struct KeyValueMemory {
    Tensor key, value;  // [max_sequence_length, b, ng, d]
  };
  KeyValueMemory& memory(const std::string& layer, const Tensor& k);

  int64_t batch_size_, max_sequence_length_;
  Device device_;
  bool started_ = false;
  std::vector<int32_t> lengths_;
  Tensor lengths_device_;
  std::map<std::string, KeyValueMemory> memory_;
};

}  // namespace mcpp
