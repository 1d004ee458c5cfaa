#include "mcpp/models/gpt/text_generation.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "mcpp/core/error.h"
#include "mcpp/core/rng.h"
#include "mcpp/transformer/inference_context.h"

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

namespace {

// The longest sequence one forward sees: seq_length, with learned absolute positions also max_position_embeddings.
int64_t context_window(const TransformerConfig& c) {
  return c.position_embedding_type == PositionEmbedding::LearnedAbsolute
             ? std::min(c.seq_length, c.max_position_embeddings)
             : c.seq_length;
}

// Row `row` of logits [n, Vp] (any device / float dtype) as float32 on the host.
Tensor logits_row(const Tensor& logits, int64_t row) {
  Tensor r = logits.narrow0(row, 1).to(Device::CPU);
  return r.dtype() == DType::F32 ? r : r.to(DType::F32);
}

// Each sequence's state: its ids so far, how many tokens it generated, whether it stopped.
struct Sequence {
  std::vector<int32_t> ids;
  int64_t generated = 0;
  bool done = false;
};

// Picks sequence q's next token from its logits row and records it.
void advance(Sequence& q, const Tensor& row, const TransformerConfig& c, const GenerationOptions& opt) {
  const int32_t next = sample_next_token(row.data<float>(), c.vocab_size, opt, static_cast<uint64_t>(q.generated));
  q.ids.push_back(next);
  ++q.generated;
  q.done = next == opt.stop_token || q.generated >= opt.max_new_tokens;
}

// The no-cache path: each step the forward over the sequence's last <= window tokens (to the end of the sequence).
void finish_without_cache(GPTModel& model, Sequence& q, const GenerationOptions& opt) {
  const TransformerConfig& c = model.config();
  const int64_t window = context_window(c);
  while (!q.done) {
    const int64_t len = std::min<int64_t>(static_cast<int64_t>(q.ids.size()), window);
    Tensor tokens = Tensor::empty({len, 1}, DType::I32);  // [s, b=1]
    std::copy(q.ids.end() - len, q.ids.end(), tokens.data<int32_t>());
    GPTModelCtx ctx;
    const Tensor logits = model.forward_logits(ctx, tokens, {.training = false});  // [s, Vp]
    advance(q, logits_row(logits, len - 1), c, opt);
  }
}

// The cached path (see the header) for every sequence while the cache holds it; the rest without it.
void generate_with_cache(GPTModel& model, std::vector<Sequence>& seqs, const GenerationOptions& opt) {
  const TransformerConfig& c = model.config();
  const int64_t window = context_window(c), b = static_cast<int64_t>(seqs.size());
  if (std::all_of(seqs.begin(), seqs.end(), [](const Sequence& q) { return q.done; })) return;
  int64_t longest = 0;
  for (const Sequence& q : seqs) longest = std::max<int64_t>(longest, static_cast<int64_t>(q.ids.size()));
  if (longest > window) return;  // a prompt already slides: no cache (the caller finishes every sequence)
  InferenceContext ic(b, std::min(window, longest + opt.max_new_tokens), model.device());
  // Prefill: the prompts right-padded (with token 0) to the longest; sequence bb's next-token logits at its last row.
  Tensor tokens = Tensor::zeros({longest, b}, DType::I32);  // [s, b]
  std::vector<int32_t> lengths(static_cast<size_t>(b));
  for (int64_t bb = 0; bb < b; ++bb) {
    const std::vector<int32_t>& ids = seqs[static_cast<size_t>(bb)].ids;
    for (size_t i = 0; i < ids.size(); ++i) tokens.data<int32_t>()[static_cast<int64_t>(i) * b + bb] = ids[i];
    lengths[static_cast<size_t>(bb)] = static_cast<int32_t>(ids.size());
  }
  GPTModelCtx ctx;
  Tensor logits = model.forward_logits(ctx, tokens, {.training = false, .inference = &ic});  // [s*b, Vp]
  for (int64_t bb = 0; bb < b; ++bb)
    advance(seqs[static_cast<size_t>(bb)], logits_row(logits, (lengths[static_cast<size_t>(bb)] - 1) * b + bb), c, opt);
  ic.set_lengths(lengths);  // every prompt's rows (pad rows beyond a length are overwritten before being read)
  // Decode: each sequence's last token at position lengths[bb], while the cache has a row for every sequence and
  // every unfinished sequence fits the window (its full forward would still start at position 0).
  auto active = [&] {
    bool any = false;
    for (size_t bb = 0; bb < seqs.size(); ++bb) {
      if (lengths[bb] >= ic.max_sequence_length()) return false;
      if (seqs[bb].done) continue;
      if (static_cast<int64_t>(seqs[bb].ids.size()) > window) return false;
      any = true;
    }
    return any;
  };
  while (active()) {
    Tensor step = Tensor::empty({1, b}, DType::I32);  // [1, b]
    for (int64_t bb = 0; bb < b; ++bb) step.data<int32_t>()[bb] = seqs[static_cast<size_t>(bb)].ids.back();
    GPTModelCtx sctx;
    logits = model.forward_logits(sctx, step, {.training = false, .inference = &ic});  // [b, Vp]
    for (int64_t bb = 0; bb < b; ++bb) {
      Sequence& q = seqs[static_cast<size_t>(bb)];
      if (!q.done) advance(q, logits_row(logits, bb), c, opt);
      ++lengths[static_cast<size_t>(bb)];  // the step's token is cached now (stopped sequences' too)
    }
    ic.set_lengths(lengths);
  }
}

}  // namespace

std::vector<std::vector<int32_t>> generate_batch(GPTModel& model, const std::vector<std::vector<int32_t>>& prompts,
                                                 const GenerationOptions& opt) {
  const TransformerConfig& c = model.config();
  if (prompts.empty()) fail("generate: no prompts");
  std::vector<Sequence> seqs;
  for (size_t p = 0; p < prompts.size(); ++p) {
    if (prompts[p].empty()) fail("generate: prompt {} encodes to zero tokens", p + 1);
    for (int32_t t : prompts[p])
      if (t < 0 || t >= c.vocab_size)
        fail("generate: prompt {}: token {} outside the vocabulary [0, {})", p + 1, t, c.vocab_size);
    seqs.push_back({.ids = prompts[p], .generated = 0, .done = opt.max_new_tokens <= 0});
  }
  if (opt.kv_cache) generate_with_cache(model, seqs, opt);
  std::vector<std::vector<int32_t>> out;
  for (Sequence& q : seqs) {
    finish_without_cache(model, q, opt);  // the no-cache path, or what the cache could not hold
    out.push_back(std::move(q.ids));
  }
  return out;
}

std::vector<int32_t> generate(GPTModel& model, const std::vector<int32_t>& prompt, const GenerationOptions& opt) {
  if (prompt.empty()) fail("generate: the prompt encodes to zero tokens");
  return std::move(generate_batch(model, {prompt}, opt).front());
}

}  // namespace mcpp
