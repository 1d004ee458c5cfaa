// mcpp forward --load DIR --tokens FILE --output logits.npy [--batch-size B]
// FILE: token ids, whitespace separated, one sequence per line (all lines the same length, <= the
// model's sequence length). Writes float32 logits [n_seq, seq, vocab_unpadded] as a NumPy .npy file.
// Sequences run B at a time (default: as many as keep one batch's logits under 256 MiB) and the logits stream
// to the file batch by batch, so any number of sequences runs in bounded memory.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "apps/mcpp/cli_parse.h"
#include "apps/mcpp/command.h"
#include "mcpp/core/error.h"
#include "mcpp/core/npy.h"
#include "mcpp/training/checkpointing.h"

namespace {

std::vector<std::vector<int32_t>> read_token_file(const std::string& path, int64_t vocab) {
  std::ifstream in(path);
  if (!in) mcpp::fail("--tokens: cannot open '{}'", path);
  std::vector<std::vector<int32_t>> seqs;
  std::string line;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    const auto ids = mcpp::cli::parse_token_ids(line, vocab, [&](const std::string& word, std::optional<long long> v) {
      if (!v) mcpp::fail("--tokens '{}' line {}: '{}' is not an integer token id", path, lineno, word);
      mcpp::fail("--tokens '{}' line {}: token {} outside the vocabulary [0, {})", path, lineno, *v, vocab);
    });
    if (ids.empty()) continue;
    if (!seqs.empty() && ids.size() != seqs.front().size())
      mcpp::fail("--tokens '{}' line {}: {} tokens, but line 1 has {} (sequences must have equal length)", path,
                 lineno, ids.size(), seqs.front().size());
    seqs.push_back(std::move(ids));
  }
  if (seqs.empty()) mcpp::fail("--tokens '{}' holds no token ids", path);
  return seqs;
}

int run_forward(const std::vector<std::string>& args) {
  CLI::App app{"Run the model forward and write logits", "mcpp forward"};
  std::string load, tokens_path, output;
  app.add_option("--load", load, "checkpoint directory")->required();
  app.add_option("--tokens", tokens_path, "token ids, one sequence per line")->required();
  app.add_option("--output", output, "logits .npy [n_seq, seq, vocab]")->required();
  int64_t batch_size = 0;
  app.add_option("--batch-size", batch_size, "sequences per forward pass (default: logits of a batch under 256 MiB)")
      ->check(CLI::NonNegativeNumber);
  mcpp::cli::parse_args(app, args);

  mcpp::LoadedModel lm = mcpp::load_model_for_inference(load);
  const auto& mc = lm.config.model;
  auto seqs = read_token_file(tokens_path, mc.vocab_size);
  const int64_t n = static_cast<int64_t>(seqs.size()), s = static_cast<int64_t>(seqs[0].size());
  const int64_t max_s = mc.position_embedding_type == mcpp::PositionEmbedding::LearnedAbsolute ? mc.max_position_embeddings
                                                                                                 : std::max(mc.seq_length, mc.max_position_embeddings);
  if (s > max_s) mcpp::fail("--tokens: sequences of {} tokens exceed the model's maximum of {}", s, max_s);
  const int64_t row_bytes = s * mc.padded_vocab_size * 4;  // one sequence's logits [s, Vp] fp32
  const int64_t batch = batch_size > 0 ? batch_size : std::clamp<int64_t>((int64_t{256} << 20) / row_bytes, 1, n);
  mcpp::NpyWriter out(output, {n, s, mc.vocab_size}, mcpp::DType::F32);
  for (int64_t first = 0; first < n; first += batch) {
    const int64_t b = std::min(batch, n - first);
    mcpp::Tensor tokens = mcpp::Tensor::empty({s, b}, mcpp::DType::I32);  // [s, b]
    for (int64_t j = 0; j < b; ++j)
      for (int64_t i = 0; i < s; ++i) tokens.data<int32_t>()[i * b + j] = seqs[first + j][i];
    mcpp::GPTModelCtx ctx;
    const mcpp::Tensor logits =
        lm.model->forward_logits(ctx, tokens, {.training = false}).to(mcpp::Device::CPU);  // [s*b, Vp]
    mcpp::Tensor part = mcpp::Tensor::empty({b, s, mc.vocab_size});                       // [b, s, V]
    for (int64_t j = 0; j < b; ++j)
      for (int64_t i = 0; i < s; ++i)
        std::copy_n(logits.data<float>() + (i * b + j) * mc.padded_vocab_size, mc.vocab_size,
                    part.data<float>() + (j * s + i) * mc.vocab_size);
    out.append(part);
  }
  out.close();
  fmt::print("wrote {} logits [{}, {}, {}] from iteration {}\n", output, n, s, mc.vocab_size, lm.iteration);
  return 0;
}

const mcpp::cli::Register reg{"forward", "run a checkpoint forward on token ids, write logits .npy", &run_forward};

}  // namespace
