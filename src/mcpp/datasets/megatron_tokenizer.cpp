// build_tokenizer and the two small tokenizers behind the interface (GPT-2 BPE adapter, NullTokenizer); the
// contract is in megatron_tokenizer.h.
#include "mcpp/datasets/megatron_tokenizer.h"

#include <fmt/format.h>

#include <charconv>

#include "mcpp/core/error.h"
#include "mcpp/datasets/gpt2_tokenizer.h"
#include "mcpp/datasets/hf_tokenizer.h"
#include "mcpp/datasets/sentencepiece_tokenizer.h"

namespace mcpp {
namespace {

class GPT2BPETokenizer final : public MegatronTokenizer {
 public:
  explicit GPT2BPETokenizer(GPT2Tokenizer tok) : tok_(std::move(tok)) {}
  std::vector<int32_t> tokenize(std::string_view text) const override { return tok_.encode(text); }
  std::string detokenize(const std::vector<int32_t>& ids) const override { return tok_.decode(ids); }
  int64_t vocab_size() const override { return tok_.vocab_size(); }
  int32_t eod() const override { return tok_.eod(); }
  const char* type() const override { return "GPT2BPETokenizer"; }

 private:
  GPT2Tokenizer tok_;
};

// Megatron's NullTokenizer: the text is the ids, space separated.
class NullTokenizer final : public MegatronTokenizer {
 public:
  explicit NullTokenizer(int64_t vocab_size) : vocab_size_(vocab_size) {}
  std::vector<int32_t> tokenize(std::string_view text) const override {
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i < text.size()) {
      const size_t b = text.find_first_not_of(" \t\r\n", i);
      if (b == std::string_view::npos) break;
      size_t e = text.find_first_of(" \t\r\n", b);
      if (e == std::string_view::npos) e = text.size();
      int64_t v = -1;
      auto [p, ec] = std::from_chars(text.data() + b, text.data() + e, v);
      if (ec != std::errc() || p != text.data() + e || v < 0 || v >= vocab_size_)
        fail("NullTokenizer: '{}' is not a token id in [0, {})", text.substr(b, e - b), vocab_size_);
      ids.push_back(static_cast<int32_t>(v));
      i = e;
    }
    return ids;
  }
  std::string detokenize(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (size_t k = 0; k < ids.size(); ++k) {
      if (ids[k] < 0 || ids[k] >= vocab_size_) fail("cannot decode token id {}: NullTokenizer has ids [0, {})", ids[k], vocab_size_);
      out += fmt::format("{}{}", k ? " " : "", ids[k]);
    }
    return out;
  }
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod() const override { return static_cast<int32_t>(vocab_size_ - 1); }
  const char* type() const override { return "NullTokenizer"; }

 private:
  int64_t vocab_size_;
};

}  // namespace

const char* tokenizer_types() { return "GPT2BPETokenizer|HuggingFaceTokenizer|SentencePieceTokenizer|NullTokenizer"; }

std::unique_ptr<MegatronTokenizer> build_tokenizer(const TokenizerOptions& o) {
  const std::string& t = o.tokenizer_type;
  const bool gpt2 = t == "GPT2BPETokenizer";
  if (!gpt2 && (!o.vocab_file.empty() || !o.merge_file.empty()))
    fail("--vocab-file / --merge-file belong to GPT2BPETokenizer, not --tokenizer-type {}", t);
  if ((gpt2 || t == "NullTokenizer") && !o.tokenizer_model.empty())
    fail("--tokenizer-model belongs to HuggingFaceTokenizer / SentencePieceTokenizer, not --tokenizer-type {}", t);
  if (gpt2) {
    if (o.vocab_file.empty() != o.merge_file.empty())
      fail("--vocab-file and --merge-file go together: give both, or neither for the default GPT-2 files");
    if (!o.vocab_file.empty())
      return std::make_unique<GPT2BPETokenizer>(GPT2Tokenizer::from_files(o.vocab_file, o.merge_file));
    const std::string dir = default_vocab_dir();
    return std::make_unique<GPT2BPETokenizer>(GPT2Tokenizer::from_files(dir + "/encoder.json", dir + "/vocab.bpe"));
  }
  if (t == "HuggingFaceTokenizer") return HuggingFaceTokenizer::from_path(o.tokenizer_model);
  if (t == "SentencePieceTokenizer") return SentencePieceTokenizer::from_file(o.tokenizer_model);
  if (t == "NullTokenizer") {
    if (o.vocab_size < 2) fail("--tokenizer-type NullTokenizer needs --vocab-size >= 2 (got {})", o.vocab_size);
    return std::make_unique<NullTokenizer>(o.vocab_size);
  }
  fail("--tokenizer-type '{}' is not supported ({})", t, tokenizer_types());
}

}  // namespace mcpp
