// mcpp data — Megatron's tools/preprocess_data.py, and a look inside indexed datasets and GPTDataset samples.
//
//   mcpp data preprocess ...   see apps/mcpp/data_preprocess.cpp
//   mcpp data info --data-path P [--split 969,30,1] [--seq-length N [--num-samples S] [--seed K]]
//     Prints dtype, sequence / document / token counts and the split's sequence ranges; with
//     --seq-length also each non-empty split's GPTDataset: samples and epochs (num-samples 0 = one epoch).
//   mcpp data samples --data-path P --seq-length S [--split 969,30,1] [--seed 1234] [--split-name train|valid|test]
//        [--num-samples N] --index I [--count C] [--json] [tokenizer flags]
//     The GPTDataset samples I .. I+C-1 of the split in Megatron's shuffled order (the same data, split,
//     seq_length, num_samples and seed give Megatron's samples): each sample's seq_length + 1 token ids (Megatron's
//     "text": inputs are [:-1], labels [1:]); with a tokenizer flag (--tokenizer-type / --tokenizer-model /
//     --vocab-file) also the text (detokenize). --json prints one JSON object {"data_path", "split", "split_name",
//     "seq_length", "seed", "num_samples", "size", "samples": [{"index", "tokens"[, "text"]}]}.
// Errors (missing input, bad JSON, bad files, an index past the split) -> mcpp::Error -> one line "error: ..."
// and exit code 2.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/mcpp/cli_parse.h"
#include "apps/mcpp/command.h"
#include "apps/mcpp/data_commands.h"
#include "apps/mcpp/tokenizer_flags.h"
#include "mcpp/core/error.h"
#include "mcpp/datasets/gpt_dataset.h"
#include "mcpp/datasets/indexed_dataset.h"

namespace {

struct InfoFlags {
  std::string prefix, split = "969,30,1";
  int64_t seq_length = 0, num_samples = 0;
  uint32_t seed = 1234;
};

int run_info(const InfoFlags& f) {
  const std::string& prefix = f.prefix;
  const std::string& split = f.split;
  mcpp::IndexedDataset ds = mcpp::IndexedDataset::open(prefix);
  fmt::print("{}: dtype {}, {} sequences, {} documents, {} tokens\n", prefix, mcpp::indexed_dtype_name(ds.dtype()),
             ds.num_sequences(), ds.num_documents(), ds.num_tokens());
  const auto b = mcpp::split_indices(split, ds.num_sequences());
  for (int k = 0; k < 3; ++k) {
    int64_t tokens = 0;
    for (int64_t q = b[k]; q < b[k + 1]; ++q) tokens += ds.sequence_length(q);
    std::string line = fmt::format("  {:<5} sequences [{}, {}), {} tokens", mcpp::split_name(k), b[k], b[k + 1], tokens);
    if (f.seq_length > 0 && b[k + 1] > b[k]) {
      auto shared = std::make_shared<const mcpp::IndexedDataset>(mcpp::IndexedDataset::open(prefix));
      mcpp::GPTDataset g(shared, {.prefix = prefix, .split = split, .split_index = k, .seq_length = f.seq_length,
                                  .num_samples = f.num_samples, .seed = f.seed});
      line += fmt::format(": {} samples of {}+1 tokens over {} epoch(s)", g.size(), f.seq_length, g.num_epochs());
    }
    fmt::print("{}\n", line);
  }
  return 0;
}

struct SamplesFlags {
  std::string prefix, split = "969,30,1", split_name = "train";
  int64_t seq_length = 0, num_samples = 0, index = -1, count = 1;
  uint32_t seed = 1234;
  bool json = false;
  mcpp::cli::TokenizerFlags tok;
};

int run_samples(const SamplesFlags& f, bool with_text) {
  int split_index = -1;
  for (int k = 0; k < 3; ++k)
    if (f.split_name == mcpp::split_name(k)) split_index = k;
  if (split_index < 0) mcpp::fail("--split-name '{}' must be train, valid or test", f.split_name);
  if (f.seq_length <= 0) mcpp::fail("--seq-length {} must be >= 1", f.seq_length);
  if (f.index < 0) mcpp::fail("--index {} must be >= 0", f.index);
  if (f.count < 1) mcpp::fail("--count {} must be >= 1", f.count);
  std::unique_ptr<mcpp::MegatronTokenizer> tok;
  if (with_text) tok = mcpp::build_tokenizer(f.tok);
  mcpp::GPTDataset ds({.prefix = f.prefix, .split = f.split, .split_index = split_index, .seq_length = f.seq_length,
                       .num_samples = f.num_samples, .seed = f.seed});
  if (f.index + f.count > ds.size())
    mcpp::fail("--index {} --count {}: the {} split of {} has samples [0, {}) at --seq-length {}", f.index, f.count,
               f.split_name, f.prefix, ds.size(), f.seq_length);
  nlohmann::json out = {{"data_path", f.prefix},       {"split", f.split},
                        {"split_name", f.split_name},  {"seq_length", f.seq_length},
                        {"seed", f.seed},              {"num_samples", f.num_samples},
                        {"size", ds.size()},           {"samples", nlohmann::json::array()}};
  for (int64_t i = f.index; i < f.index + f.count; ++i) {
    const std::vector<int32_t> tokens = ds.sample(i).tokens;  // [seq_length + 1]
    nlohmann::json s = {{"index", i}, {"tokens", tokens}};
    if (tok) s["text"] = tok->detokenize(tokens);
    if (!f.json) {
      fmt::print("sample {} ({} of {}, {} tokens):", i, f.split_name, ds.size(), tokens.size());
      for (int32_t t : tokens) fmt::print(" {}", t);
      fmt::print("\n");
      if (tok) fmt::print("text: {}\n", s["text"].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    }
    out["samples"].push_back(std::move(s));
  }
  if (f.json) fmt::print("{}\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  return 0;
}

int run_data(const std::vector<std::string>& args) {
  CLI::App app{"mcpp data: build and inspect Megatron indexed datasets", "mcpp data"};
  app.require_subcommand(1);
  mcpp::cli::PreprocessFlags f;
  CLI::App* pre = app.add_subcommand("preprocess", "tokenize .jsonl/.txt into {prefix}_{key}_document.bin/.idx");
  mcpp::cli::add_preprocess_flags(*pre, f);
  InfoFlags inf;
  CLI::App* info = app.add_subcommand("info", "counts and split ranges of an indexed dataset");
  info->add_option("--data-path", inf.prefix, "dataset prefix (without .bin/.idx)")->required();
  info->add_option("--split", inf.split, "Megatron --split")->capture_default_str();
  info->add_option("--seq-length", inf.seq_length, "also build each split's GPTDataset at this length");
  info->add_option("--num-samples", inf.num_samples, "samples per split for --seq-length (0 = one epoch)");
  info->add_option("--seed", inf.seed, "shuffle seed for --seq-length")->capture_default_str();
  SamplesFlags sf;
  CLI::App* smp = app.add_subcommand("samples", "token ids (and text) of GPTDataset samples in Megatron's order");
  smp->add_option("--data-path", sf.prefix, "dataset prefix (without .bin/.idx)")->required();
  smp->add_option("--seq-length", sf.seq_length, "sequence length")->required();
  smp->add_option("--split", sf.split, "Megatron --split")->capture_default_str();
  smp->add_option("--split-name", sf.split_name, "train|valid|test")->capture_default_str();
  smp->add_option("--seed", sf.seed, "Megatron --seed")->capture_default_str();
  smp->add_option("--num-samples", sf.num_samples, "the split's sample count (Megatron: iters x global batch; 0 = one "
                                                    "epoch); it fixes the epochs and so the order");
  smp->add_option("--index", sf.index, "first sample")->required();
  smp->add_option("--count", sf.count, "number of samples")->capture_default_str();
  smp->add_flag("--json", sf.json, "one JSON object on stdout");
  mcpp::cli::add_tokenizer_flags(*smp, sf.tok);
  mcpp::cli::parse_args(app, args);  // `data preprocess --help`: the subcommand's help, "mcpp data preprocess"
  if (pre->parsed()) return mcpp::cli::run_preprocess(f);
  if (smp->parsed()) {
    const bool with_text = smp->count("--tokenizer-type") + smp->count("--tokenizer-model") +
                               smp->count("--vocab-file") + smp->count("--vocab-size") > 0;
    return run_samples(sf, with_text);
  }
  return run_info(inf);
}

const mcpp::cli::Register reg{"data", "Megatron indexed datasets: preprocess (tokenize text), info, samples",
                              &run_data};

}  // namespace
