// Autoregressive generation with a GPTModel (Megatron's text_generation: greedy, temperature, top-k).
// Each step runs the model forward (no dropout) over the last <= seq_length tokens and picks the next
// token from the logits of the last position, restricted to the unpadded vocabulary.
#pragma once
#include <cstdint>
#include <vector>

#include "mcpp/models/gpt/gpt_model.h"

namespace mcpp {

struct GenerationOptions {
  int64_t max_new_tokens = 32;
  float temperature = 0.0f;  // 0 -> greedy
  int64_t top_k = 0;         // 0 -> whole vocabulary
  uint64_t seed = 1234;
  int32_t stop_token = -1;   // e.g. EOD; -1 = never stop early
};

// Returns prompt + generated ids. The prompt must be non-empty and its ids < vocab_size.
std::vector<int32_t> generate(GPTModel& model, const std::vector<int32_t>& prompt, const GenerationOptions& opt);

// Next-token choice from one row of logits [vocab] (exposed for tests).
int32_t sample_next_token(const float* logits, int64_t vocab, const GenerationOptions& opt, uint64_t step);

}  // namespace mcpp
