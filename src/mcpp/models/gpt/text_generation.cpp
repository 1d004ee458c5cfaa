#include "mcpp/models/gpt/text_generation.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "mcpp/core/error.h"
#include "mcpp/core/rng.h"

namespace mcpp {

int32_t sample_next_token(const float* logits, int64_t vocab, const GenerationOptions& opt, uint64_t step) {
  if (opt.temperature <= 0.0f || opt.top_k == 1)
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  std::vector<int32_t> idx(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  int64_t k = opt.top_k > 0 ? std::min(opt.top_k, vocab) : vocab;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const double top = logits[idx[0]];
  std::vector<double> w(static_cast<size_t>(k));
  double total = 0;
  for (int64_t i = 0; i < k; ++i) total += w[i] = std::exp((logits[idx[i]] - top) / opt.temperature);
  // One uniform draw from the (seed, step) Philox stream: reproducible given --seed.
  double u = philox_uniform_at({opt.seed, step}, 0) * total;
  for (int64_t i = 0; i < k; ++i) {
    if (u < w[i]) return idx[i];
    u -= w[i];
  }
  return idx[k - 1];
}

std::vector<int32_t> generate(GPTModel& model, const std::vector<int32_t>& prompt, const GenerationOptions& opt) {
  const TransformerConfig& c = model.config();
  if (prompt.empty()) fail("generate: the prompt encodes to zero tokens");
  for (int32_t t : prompt)
    if (t < 0 || t >= c.vocab_size) fail("generate: prompt token {} outside the vocabulary [0, {})", t, c.vocab_size);
  const int64_t window = c.position_embedding_type == PositionEmbedding::LearnedAbsolute
                             ? std::min(c.seq_length, c.max_position_embeddings)
                             : c.seq_length;
  std::vector<int32_t> out = prompt;
  for (int64_t step = 0; step < opt.max_new_tokens; ++step) {
    const int64_t len = std::min<int64_t>(static_cast<int64_t>(out.size()), window);
    Tensor tokens = Tensor::empty({len, 1}, DType::I32);  // [s, b=1]
    std::copy(out.end() - len, out.end(), tokens.data<int32_t>());
    GPTModelCtx ctx;
    Tensor logits = model.forward_logits(ctx, tokens, {.training = false}).to(Device::CPU);  // [s, Vp]
    const float* last = logits.data<float>() + (len - 1) * c.padded_vocab_size;
    int32_t next = sample_next_token(last, c.vocab_size, opt, static_cast<uint64_t>(step));
    out.push_back(next);
    if (next == opt.stop_token) break;
  }
  return out;
}

}  // namespace mcpp
