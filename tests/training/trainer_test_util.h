// Shared by the trainer tests (CPU and CUDA): a small learnable corpus, a tiny training config on it,
// the size-1 parallel context, and the mcpp::Error message of a call.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "core/core_test_util.h"
#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/core/error.h"
#include "mcpp/datasets/indexed_dataset.h"
#include "mcpp/parallel_state/parallel_context.h"
#include "mcpp/training/config.h"
#include "mcpp/training/trainer.h"
#include "mcpp/transformer/transformer_config.h"

namespace mcpp::training_test {

// A corpus with structure: each document is an arithmetic walk t -> (3t + 1) mod 97, so the next token
// is predictable and the loss can fall far below log(V).
inline std::string make_corpus(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  const std::string prefix = (dir / "walk").string();
  IndexedDatasetBuilder b(prefix + ".bin", IndexedDType::U16);
  uint32_t state = 12345;
  for (int d = 0; d < 300; ++d) {
    state = state * 1664525u + 1013904223u;
    std::vector<int32_t> doc;
    int32_t t = static_cast<int32_t>(state % 97);
    for (int i = 0; i < 10 + static_cast<int>((state >> 8) % 30); ++i, t = (3 * t + 1) % 97) doc.push_back(t);
    doc.push_back(99);  // EOD
    b.add_item(std::span<const int32_t>(doc));
    b.end_document();
  }
  b.finalize(prefix + ".idx");
  return prefix;
}

inline Config tiny_train_config(const std::string& data_prefix, int64_t train_iters = 10) {
  Config c;
  c.model.num_layers = 2;
  c.model.hidden_size = 32;
  c.model.num_attention_heads = 4;
  c.model.seq_length = 16;
  c.model.max_position_embeddings = 16;
  c.model.hidden_dropout = 0.1f;
  c.model.attention_dropout = 0.1f;
  c.model.attention_impl = "unfused";  // the materialized-probs dropout path (flash: tests/transformer)
  c.model.make_vocab_size_divisible_by = 64;
  c.training.micro_batch_size = 4;
  c.training.global_batch_size = 8;  // 2 microbatches: gradient accumulation is exercised
  c.training.train_iters = train_iters;  // before finalize(): lr_decay_iters defaults to it
  c.training.log_interval = 5;
  c.training.eval_interval = 5;
  c.training.eval_iters = 1;
  c.optimizer.lr = 3e-3f;
  c.optimizer.min_lr = 3e-4f;
  c.optimizer.lr_warmup_iters = 2;
  c.optimizer.lr_decay_style = LrDecayStyle::Cosine;
  c.data.data_path = {data_prefix};
  c.data.split = "90,10,0";
  c.data.tokenizer_type = "NullTokenizer";
  c.model.vocab_size = 100;
  c.training.device = "cpu";  // the unfused attention path is CPU-only: these tests also run on GPU machines
  c.finalize();
  c.apply_world_size(1);
  c.model.set_vocab_size(100, 1);
  c.validate();
  return c;
}

inline parallel_state::ParallelContext single() {
  return parallel_state::ParallelContext::single(comm::make_local_world());
}

// The tiny config at a GPU-friendly size: d128, 2 heads of 64 (cuDNN flash attention), s64, no dropout,
// --device cuda, 8 iterations with an evaluation at 5.
inline Config gpu_train_config(const std::string& data_prefix) {
  Config c = tiny_train_config("unused", 8);
  c.data.data_path = {data_prefix};
  c.model.hidden_size = 128;
  c.model.num_attention_heads = 2;
  c.model.num_query_groups = 2;
  c.model.kv_channels = 64;  // the flash attention's head dim (cuDNN)
  c.model.ffn_hidden_size = 512;
  c.model.seq_length = 64;
  c.model.max_position_embeddings = 64;
  c.model.attention_impl = "flash";
  c.model.hidden_dropout = 0.0f;
  c.model.attention_dropout = 0.0f;
  c.training.device = "cuda";
  c.training.log_interval = 4;
  c.training.eval_interval = 5;  // an eager evaluation between replays
  return c;
}

// c trained under --enable-cuda-graph (captured at step 3 after 2 warm-up steps: 8 iterations replay 6), the metrics
// to metrics_path when given: the graphed half of the GPU tests' eager-vs-graphed comparisons. c itself is unchanged.
inline TrainSummary train_graphed(Config c, const std::string& metrics_path = "") {
  c.training.enable_cuda_graph = true;
  c.training.cuda_graph_warmup_steps = 2;
  if (!metrics_path.empty()) c.training.metrics_path = metrics_path;
  c.validate();
  return Trainer(c, 99, single()).train();
}

using mcpp::testing::error_of;  // the mcpp::Error message fn throws, or "" when it returns

// A resume continues bit for bit: c (8 iterations) in one run equals 4 iterations, a checkpoint in ckpt_dir, and
// the 4 more of a run loading it (the shorter run keeps the 8-iteration lr schedule: set at finalize). Returns the
// 8-iteration run's summary.
inline TrainSummary expect_resume_bit_exact(const Config& c, const std::filesystem::path& ckpt_dir) {
  const TrainSummary full = Trainer(c, 99, single()).train();
  EXPECT_EQ(full.losses.size(), 8u);
  Config first = c;
  first.training.train_iters = 4;
  first.training.save = ckpt_dir.string();
  Trainer(first, 99, single()).train();
  Config resumed = c;
  resumed.training.load = first.training.save;
  const TrainSummary rest = Trainer(resumed, 99, single()).train();
  EXPECT_EQ(rest.losses.size(), 4u);
  for (size_t i = 0; i < 4 && i < rest.losses.size() && 4 + i < full.losses.size(); ++i)
    EXPECT_EQ(rest.losses[i], full.losses[4 + i]) << "iteration " << 5 + i;
  return full;
}

}  // namespace mcpp::training_test
