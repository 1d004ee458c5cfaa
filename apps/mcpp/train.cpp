// mcpp train [--config RECIPE.toml] [Megatron-LM flags]: single-process pretraining on CPU.
// The tokenizer fixes the vocabulary (padded to --make-vocab-size-divisible-by), then the Trainer runs.
#include <fmt/format.h>

#include "apps/mcpp/command.h"
#include "mcpp/core/error.h"
#include "mcpp/datasets/gpt2_tokenizer.h"
#include "mcpp/training/arguments.h"
#include "mcpp/training/trainer.h"

namespace {

int run_train(const std::vector<std::string>& args) {
  mcpp::Config cfg = mcpp::parse_train_args(args);
  cfg.validate_for_training();
  if (cfg.training.bf16 || cfg.training.fp16)
    mcpp::fail("{}: mixed-precision training needs the CUDA backend; the CPU trainer runs in fp32",
               cfg.training.bf16 ? "bf16" : "fp16");
  cfg.apply_world_size(1);
  int64_t eod = -1;
  if (cfg.data.tokenizer_type == "GPT2BPETokenizer") {
    if (cfg.data.vocab_file.empty() != cfg.data.merge_file.empty())
      mcpp::fail("vocab_file and merge_file go together (got only {})",
                 cfg.data.vocab_file.empty() ? "merge_file" : "vocab_file");
    const std::string dir = mcpp::default_vocab_dir();
    mcpp::GPT2Tokenizer tok = mcpp::GPT2Tokenizer::from_files(
        cfg.data.vocab_file.empty() ? dir + "/encoder.json" : cfg.data.vocab_file,
        cfg.data.merge_file.empty() ? dir + "/vocab.bpe" : cfg.data.merge_file);
    cfg.model.set_vocab_size(tok.vocab_size(), cfg.parallel.tensor_model_parallel_size);
    eod = tok.eod();
  } else {  // NullTokenizer (Megatron's _NullTokenizer): ids < vocab_size, EOD = vocab_size - 1
    cfg.model.set_vocab_size(cfg.model.vocab_size, cfg.parallel.tensor_model_parallel_size);
    eod = cfg.model.vocab_size - 1;
  }
  cfg.validate();
  fmt::print("{}\n", mcpp::format_args(cfg));
  mcpp::Trainer trainer(cfg, eod);
  mcpp::TrainSummary s = trainer.train();
  fmt::print("training done: {} iterations run, at iteration {}\n", s.iterations_run, s.final_iteration);
  return 0;
}

const mcpp::cli::Register reg{"train", "pretrain a GPT (Megatron-LM flags, --config recipe.toml)", &run_train};

}  // namespace
