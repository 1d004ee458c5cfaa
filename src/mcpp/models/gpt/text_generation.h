// Autoregressive generation with a GPTModel (Megatron's text_generation: greedy, temperature, top-k), one prompt or a
// batch of prompts of any lengths. The next token comes from the logits of a sequence's last position, restricted to
// the unpadded vocabulary.
//   With the KV cache (default; Megatron's inference path, transformer/inference_context.h): one forward over the
//   prompts right-padded to the longest (the prefill: every attention layer stores its keys / values), then one token
//   per sequence a step (the decode: tokens [1, b], each at its own position, attending over its cached rows).
//   Without it (kv_cache = false, `mcpp generate --no-kv-cache`): every step runs the forward over the sequence's
//   last <= window tokens (window = seq_length; with learned absolute positions also <= max_position_embeddings),
//   one sequence at a time — the reference the cached path must equal.
// A sequence longer than the window slides (the no-cache definition); the cache cannot slide (positions restart), so
// once a sequence would pass the window — or the cache is full — the unfinished sequences continue without it.
// Greedy decoding gives the same tokens either way (tests/models/text_generation_test.cpp); the cached logits equal
// the full forward's within float32 rounding (other summation orders). A sequence stops at stop_token; the batch's
// forward keeps feeding a stopped one its last token (its outputs unused) until every sequence has stopped.
// MoE layers route each step's tokens in inference mode; with a capacity factor (token dropping) a decode step's
// tokens compete only with each other, not with the whole sequence as in the full forward (dropless MoE: equal).
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
  bool kv_cache = true;      // false: the full forward per token (--no-kv-cache)
};

// Returns prompt + generated ids. The prompt must be non-empty and its ids < vocab_size.
std::vector<int32_t> generate(GPTModel& model, const std::vector<int32_t>& prompt, const GenerationOptions& opt);
// A batch: each result is prompt + generated ids, as generate() of that prompt alone returns them (greedy: the same
// tokens; sampling draws from the same (seed, step) stream for every sequence).
std::vector<std::vector<int32_t>> generate_batch(GPTModel& model, const std::vector<std::vector<int32_t>>& prompts,
                                                 const GenerationOptions& opt);

// Next-token choice from one row of logits [vocab] (exposed for tests).
int32_t sample_next_token(const float* logits, int64_t vocab, const GenerationOptions& opt, uint64_t step);

}  // namespace mcpp
