// mcpp generate --load DIR --prompt TEXT --max-new-tokens N [--temperature T --top-k K --seed S]
// Greedy by default (temperature 0); sampling with temperature and top-k. Prints the prompt followed by
// the generated text. Tokenizer flags as `mcpp tokenize` (default: the GPT-2 vocabulary); the prompt is tokenized as
// Megatron does (a Hugging Face tokenizer's BOS included), the continuation decoded with detokenize.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cmath>

#include "apps/mcpp/cli_parse.h"
#include "apps/mcpp/command.h"
#include "apps/mcpp/tokenizer_flags.h"
#include "mcpp/core/error.h"
#include "mcpp/models/gpt/text_generation.h"
#include "mcpp/training/checkpointing.h"

namespace {

int run_generate(const std::vector<std::string>& args) {
  CLI::App app{"Generate text from a checkpoint", "mcpp generate"};
  std::string load, prompt;
  mcpp::GenerationOptions opt;
  int64_t seed = 1234;
  bool stop_at_eod = true;
  mcpp::cli::TokenizerFlags tok_flags;
  app.add_option("--load", load, "checkpoint directory (save dir or iter_N)")->required();
  app.add_option("--prompt", prompt, "prompt text")->required();
  app.add_option("--max-new-tokens", opt.max_new_tokens, "tokens to generate")->check(CLI::NonNegativeNumber);
  app.add_option("--temperature", opt.temperature, "0 = greedy")->check(CLI::NonNegativeNumber);
  app.add_option("--top-k", opt.top_k, "sample among the k most likely tokens (0 = all)")->check(CLI::NonNegativeNumber);
  app.add_option("--seed", seed, "sampling seed");
  app.add_flag("!--no-stop-at-eod", stop_at_eod, "keep generating past <|endoftext|>");
  mcpp::cli::add_tokenizer_flags(app, tok_flags);
  mcpp::cli::parse_args(app, args);
  if (!std::isfinite(opt.temperature))  // CLI11's NonNegativeNumber lets nan and inf through
    mcpp::fail("--temperature must be a finite number >= 0 (0 = greedy), got {}", opt.temperature);

  const auto tok = mcpp::build_tokenizer(tok_flags);
  mcpp::LoadedModel lm = mcpp::load_model_for_inference(load);
  if (lm.config.model.vocab_size != tok->vocab_size())
    mcpp::fail("the checkpoint's vocab_size {} differs from the {}'s {}", lm.config.model.vocab_size, tok->type(),
               tok->vocab_size());
  opt.seed = static_cast<uint64_t>(seed);
  opt.stop_token = stop_at_eod ? tok->eod() : -1;
  std::vector<int32_t> prompt_ids = tok->tokenize(prompt);
  std::vector<int32_t> out = mcpp::generate(*lm.model, prompt_ids, opt);
  std::vector<int32_t> gen(out.begin() + static_cast<std::ptrdiff_t>(prompt_ids.size()), out.end());
  if (!gen.empty() && gen.back() == tok->eod()) gen.pop_back();
  fmt::print("{}{}\n", prompt, tok->detokenize(gen));
  return 0;
}

const mcpp::cli::Register reg{"generate", "generate text from a checkpoint (greedy / temperature / top-k)",
                              &run_generate};

}  // namespace
