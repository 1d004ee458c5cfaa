// mcpp generate --load DIR (--prompt TEXT | --batch FILE) --max-new-tokens N [--temperature T --top-k K --seed S]
//               [--no-kv-cache] [--device cpu|cuda] [--bf16] [--prompt-ids]
// Greedy by default (temperature 0); sampling with temperature and top-k. With the KV cache (default) the prompts'
// prefill, then one token per sequence a step (models/gpt/text_generation.h); --no-kv-cache re-runs the whole forward
// per token (the reference). --prompt prints the prompt followed by the generated text; --batch FILE (one prompt a
// line, blank lines skipped; run as one batch, ragged lengths) prints one JSON line per prompt:
// {"prompt": ..., "completion": ...}. --prompt-ids: prompts are token ids separated by spaces and completions are
// printed as ids (no tokenizer: checkpoints of any vocabulary, e.g. NullTokenizer; no stop at EOD). Tokenizer
// flags as `mcpp tokenize` (default: the GPT-2 vocabulary; a Hugging Face tokenizer adds its BOS, as Megatron). On
// stderr: "generate: N tokens ... tokens/s" (the
// generation only, not the checkpoint load).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/mcpp/cli_parse.h"
#include "apps/mcpp/command.h"
#include "apps/mcpp/tokenizer_flags.h"
#include "mcpp/core/device_memory.h"
#include "mcpp/core/error.h"
#include "mcpp/core/regular_file.h"
#include "mcpp/models/gpt/text_generation.h"
#include "mcpp/training/checkpointing.h"
#include "mcpp/training/trainer.h"

namespace {

std::vector<std::string> read_prompt_file(const std::string& path) {
  std::istringstream in(mcpp::read_regular_file(path, "--batch file", uint64_t{1} << 30));
  std::vector<std::string> prompts;
  for (std::string line; std::getline(in, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) prompts.push_back(line);
  if (prompts.empty()) mcpp::fail("--batch '{}' holds no prompts", path);
  return prompts;
}

std::vector<int32_t> parse_ids(const std::string& text, size_t prompt_no) {
  return mcpp::cli::parse_token_ids(text, int64_t{INT32_MAX} + 1, [&](const std::string& word, auto) {
    mcpp::fail("--prompt-ids: prompt {}: '{}' is not a token id", prompt_no, word);
  });
}

std::string ids_text(const std::vector<int32_t>& ids) {
  return fmt::format("{}", fmt::join(ids, " "));
}

int run_generate(const std::vector<std::string>& args) {
  CLI::App app{"Generate text from a checkpoint", "mcpp generate"};
  std::string load, prompt, batch, device = "cpu";
  mcpp::GenerationOptions opt;
  int64_t seed = 1234;
  bool stop_at_eod = true, no_kv_cache = false, bf16 = false, prompt_ids = false;
  mcpp::cli::TokenizerFlags tok_flags;
  app.add_option("--load", load, "checkpoint directory (save dir or iter_N)")->required();
  auto* p_opt = app.add_option("--prompt", prompt, "prompt text");
  auto* b_opt = app.add_option("--batch", batch, "file of prompts, one a line, generated as one batch");
  p_opt->excludes(b_opt);
  app.add_option("--max-new-tokens", opt.max_new_tokens, "tokens to generate")->check(CLI::NonNegativeNumber);
  app.add_option("--temperature", opt.temperature, "0 = greedy")->check(CLI::NonNegativeNumber);
  app.add_option("--top-k", opt.top_k, "sample among the k most likely tokens (0 = all)")->check(CLI::NonNegativeNumber);
  app.add_option("--seed", seed, "sampling seed");
  app.add_flag("!--no-stop-at-eod", stop_at_eod, "keep generating past <|endoftext|>");
  app.add_flag("--no-kv-cache", no_kv_cache, "re-run the whole forward per token (no key/value cache)");
  app.add_option("--device", device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_flag("--bf16", bf16, "bf16 parameters and activations (mixed precision; --device cuda)");
  app.add_flag("--prompt-ids", prompt_ids, "prompts and completions are token ids (no tokenizer)");
  mcpp::cli::add_tokenizer_flags(app, tok_flags);
  mcpp::cli::parse_args(app, args);
  if (!std::isfinite(opt.temperature))  // CLI11's NonNegativeNumber lets nan and inf through
    mcpp::fail("--temperature must be a finite number >= 0 (0 = greedy), got {}", opt.temperature);
  if (prompt.empty() == batch.empty()) mcpp::fail("generate: give one of --prompt TEXT or --batch FILE");
  const std::vector<std::string> texts = batch.empty() ? std::vector<std::string>{prompt} : read_prompt_file(batch);

  mcpp::TrainingConfig dev_cfg;
  dev_cfg.device = device;
  const mcpp::Device dev = mcpp::resolve_training_device(dev_cfg);
  if (bf16 && dev != mcpp::Device::CUDA) mcpp::fail("bf16: mixed-precision inference needs --device cuda");
  std::unique_ptr<mcpp::MegatronTokenizer> tok;
  if (!prompt_ids) tok = mcpp::build_tokenizer(tok_flags);
  mcpp::LoadedModel lm = mcpp::load_model_for_inference(load, dev, bf16 ? mcpp::DType::BF16 : mcpp::DType::F32);
  if (tok && lm.config.model.vocab_size != tok->vocab_size())
    mcpp::fail("the checkpoint's vocab_size {} differs from the tokenizer's {} (a token-id model: --prompt-ids)",
               lm.config.model.vocab_size, tok->vocab_size());
  opt.seed = static_cast<uint64_t>(seed);
  opt.stop_token = stop_at_eod && tok ? tok->eod() : -1;
  opt.kv_cache = !no_kv_cache;
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < texts.size(); ++i) prompts.push_back(tok ? tok->tokenize(texts[i]) : parse_ids(texts[i], i + 1));

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::vector<int32_t>> outs = mcpp::generate_batch(*lm.model, prompts, opt);
  mcpp::cuda_synchronize();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t generated = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    std::vector<int32_t> gen(outs[i].begin() + static_cast<std::ptrdiff_t>(prompts[i].size()), outs[i].end());
    generated += static_cast<int64_t>(gen.size());
    if (tok && !gen.empty() && gen.back() == tok->eod()) gen.pop_back();
    const std::string completion = tok ? tok->detokenize(gen) : ids_text(gen);
    if (batch.empty())
      fmt::print("{}{}{}\n", texts[i], tok ? "" : " ", completion);
    else
      fmt::print("{}\n", nlohmann::json{{"prompt", texts[i]}, {"completion", completion}}.dump());
  }
  fmt::print(stderr, "generate: {} new tokens for {} prompt(s) in {:.3f} s: {:.1f} tokens/s (KV cache {}, {}{})\n",
             generated, outs.size(), secs, secs > 0 ? static_cast<double>(generated) / secs : 0.0,
             opt.kv_cache ? "on" : "off", dev == mcpp::Device::CUDA ? "cuda" : "cpu", bf16 ? ", bf16" : "");
  return 0;
}

const mcpp::cli::Register reg{"generate", "generate text from a checkpoint (greedy / temperature / top-k, KV cache)",
                              &run_generate};

}  // namespace
