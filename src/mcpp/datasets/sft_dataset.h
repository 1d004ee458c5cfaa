// SFTDataset — Megatron-LM's SFT dataset (`--sft`, megatron/training/datasets/sft_dataset.py) over a JSONL file of
// conversations (sft_conversation.h: the line forms, prompt formats and loss targets), packed into sequences.
//
// Split: the file's non-blank lines are the elements (Megatron's SFTLowLevelDataset), cut by --split with
//   Megatron-Core's bookends (split_indices); this split's lines are used in file order (Megatron's SFT indices are
//   not shuffled), and samples past size() wrap around (the trainer's modulo, Megatron's idx % len(indices)).
// Packing: every conversation of those lines, tokenized (EOD appended), is placed in order into bins of
//   seq_length + 1 tokens (inputs tokens[:-1], labels tokens[1:]): a conversation goes into the current bin when it
//   fits, else it starts a new bin (next-fit: the order is kept); one longer than a bin is truncated on the right to
//   fill a bin of its own (Megatron's truncation). The rest of a bin is padding (the EOD id, never trained).
//   Megatron-LM packs the conversations of one line into one sample; mcpp packs consecutive lines as well, so short
//   prompt / response pairs share a sequence instead of padding it.
// Sample i = bin i: tokens [seq_length + 1]; loss_mask[p] = 1 where label p + 1 is a trained token of the same
//   document as input p (the prompt, padding and the step across a document boundary are masked; Megatron's
//   IGNORE_INDEX / pad masking); documents(i) = the starts of its conversations (and of its padding) below
//   seq_length, then seq_length — packed_seq_params' cu_seqlens: each conversation attends within itself and its
//   positions restart (Megatron's SFT batches always carry cu_seqlens).
// The whole split is tokenized on construction (every rank does the same; deterministic). Errors (file, line,
// field; an empty split) are mcpp::Error.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "mcpp/datasets/megatron_dataset.h"
#include "mcpp/datasets/megatron_tokenizer.h"

namespace mcpp {

struct SFTDatasetOptions {
  std::string path;             // the JSONL file (--data-path)
  std::string split = "969,30,1";
  int split_index = 0;          // 0 train, 1 valid, 2 test
  int64_t seq_length = 0;
  std::string prompt_format = "nemotron-h-aligned";  // --sft-tokenizer-prompt-format
  const MegatronTokenizer* tokenizer = nullptr;      // outlives construction only
};

class SFTDataset final : public MegatronDataset {
 public:
  explicit SFTDataset(const SFTDatasetOptions& opt);

  int64_t size() const override { return static_cast<int64_t>(bins_.size()); }
  void sample(int64_t i, std::span<int32_t> tokens, std::span<float> loss_mask) const override;
  std::vector<int32_t> documents(int64_t i) const override;
  const std::string& prefix_of(int64_t) const override { return path_; }

  int64_t num_conversations() const { return num_conversations_; }
  int64_t num_truncated() const { return num_truncated_; }  // conversations cut to one bin

 private:
  struct Bin {
    std::vector<int32_t> tokens;   // [seq_length + 1]
    std::vector<uint8_t> trained;  // [seq_length + 1]
    std::vector<int32_t> starts;   // the documents' first positions (0 first; the padding's start last when any)
  };
  const Bin& bin(int64_t i) const;
  std::string path_;
  int64_t seq_length_ = 0;
  int64_t num_conversations_ = 0, num_truncated_ = 0;
  std::vector<Bin> bins_;
};

}  // namespace mcpp
