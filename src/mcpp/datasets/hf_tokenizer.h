// HuggingFaceTokenizer — Megatron's --tokenizer-type HuggingFaceTokenizer: a tokenizer.json (Hugging Face
// `tokenizers`' serialization) run as `tokenizers` runs it, for the BPE families: byte-level BPE (Llama 3,
// Qwen2 / Qwen3, GPT-NeoX, Mistral-Nemo, GPT-2 style) and SentencePiece-style BPE with byte fallback
// (Llama 2, Mistral 7B: Metaspace or Prepend + Replace normalizers).
//
// tokenize(text), as `tokenizers`' encode(text, add_special_tokens=True):
//   1. added tokens with normalized = false are split out of the raw text (leftmost-longest; lstrip / rstrip take
//      the neighbouring whitespace, single_word needs word boundaries);
//   2. each remaining split is normalized on its own, then added tokens with normalized = true are split out;
//   3. each remaining piece is pre-tokenized into words, and the BPE model encodes each word (hf_bpe.h);
//   4. the post-processor's single template adds its special tokens (Llama's BOS) — not in tokenize_text
//      (add_special_tokens=False).
// detokenize(ids): ids -> token strings (added tokens first), the decoder chain, special tokens kept (Megatron's
// detokenize). The text must be valid UTF-8 (Python strings are): otherwise an mcpp::Error naming the offset.
// eod() / bos(): tokenizer_config.json's eos_token / bos_token beside tokenizer.json (a string or {"content": ..});
// without that file, eod is the first special added token among </s>, <|endoftext|>, <|end_of_text|>, <eos>.
// vocab_size(): the largest id (model or added token) + 1 (Hugging Face's len(tokenizer) when ids are dense).
// Loading checks everything named above and throws mcpp::Error "tokenizer.json '<path>': <what is wrong>".
#pragma once
#include <memory>
#include <string>

#include "mcpp/datasets/megatron_tokenizer.h"

namespace mcpp {

class HuggingFaceTokenizer final : public MegatronTokenizer {
 public:
  // `model`: a directory holding tokenizer.json (and optionally tokenizer_config.json), or a tokenizer.json.
  static std::unique_ptr<HuggingFaceTokenizer> from_path(const std::string& model);
  ~HuggingFaceTokenizer() override;

  std::vector<int32_t> tokenize(std::string_view text) const override;
  std::vector<int32_t> tokenize_text(std::string_view text) const override;  // without the post-processor
  std::string detokenize(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override;
  int32_t eod() const override;
  int32_t bos() const override;
  const char* type() const override { return "HuggingFaceTokenizer"; }
  int32_t token_to_id(std::string_view token) const;  // added tokens first; -1 when absent

  struct Impl;

 private:
  explicit HuggingFaceTokenizer(std::unique_ptr<Impl> impl);
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mcpp
