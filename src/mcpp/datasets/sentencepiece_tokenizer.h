// SentencePieceTokenizer — Megatron's --tokenizer-type SentencePieceTokenizer --tokenizer-model tokenizer.model,
// through Debian's libsentencepiece (the library Megatron's Python wrapper calls): tokenize = encode_as_ids
// (no BOS / EOS added), detokenize = decode_ids, vocab_size = get_piece_size, eod = eos_id, bos = bos_id.
// A missing or malformed .model, or one without an EOS piece, is an mcpp::Error naming the file.
// Long texts with a unigram model: Debian's libsentencepiece 0.1.97 sums the Viterbi path score in float32 over the
// whole input, and past ~100 KB a string it misses the optimal segmentation (sentencepiece 0.2.x mostly finds it;
// docs/TOKENIZERS.md). When every segmentation must break before each whitespace — a unigram model whose pieces hold
// "\u2581" only first, with the default whitespace handling (dummy prefix, extra whitespace removed, escaped) — a text
// over kChunkBytes is encoded in chunks cut before single ASCII spaces between ASCII letters / digits (~kChunkBytes/2
// each): the same optimum, summed without the drift. Shorter texts and other models: one Encode call, as before.
// Thread safety: SentencePieceProcessor's Encode / Decode are const and thread-safe.
#pragma once
#include <memory>
#include <string>

#include "mcpp/datasets/megatron_tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace mcpp {

class SentencePieceTokenizer final : public MegatronTokenizer {
 public:
  static std::unique_ptr<SentencePieceTokenizer> from_file(const std::string& model);
  ~SentencePieceTokenizer() override;

  std::vector<int32_t> tokenize(std::string_view text) const override;
  std::string detokenize(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override;
  int32_t eod() const override;
  int32_t bos() const override;
  const char* type() const override { return "SentencePieceTokenizer"; }
  bool encodes_in_chunks() const { return chunked_; }  // the model allows whitespace chunks (above)
  static constexpr size_t kChunkBytes = 64 * 1024;

 private:
  SentencePieceTokenizer(std::string path, std::unique_ptr<sentencepiece::SentencePieceProcessor> sp);
  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  bool chunked_ = false;
};

}  // namespace mcpp
