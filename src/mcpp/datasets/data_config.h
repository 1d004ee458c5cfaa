// DataConfig: the training data and its tokenizer (Megatron's --data-path, --split, --tokenizer-type, ...; the
// data section of the config JSON / TOML). Fields declared once in fields() (core/config_fields.h); validate()
// checks its own fields (one-line mcpp::Error naming the field): paths are prefixes or blends
// (datasets/blended_dataset.h), the split parses.
#pragma once
#include <array>
#include <string>
#include <vector>

#include "mcpp/core/config_fields.h"

namespace mcpp {

struct DataConfig {
  // a prefix, or Megatron's blend "weight prefix weight prefix ..." (datasets/blended_dataset.h)
  std::vector<std::string> data_path;
  // Megatron's per-split data (--train-data-path / --valid-data-path / --test-data-path; exclusive with data_path):
  // each split reads the whole of its own prefix or blend (--split does not apply); no valid path: no evaluation.
  // (the test split, of test_data_path or --split's third weight, is evaluated once at the end of training.)
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  std::string split = "969,30,1";
  // GPT2BPETokenizer | HuggingFaceTokenizer | SentencePieceTokenizer | NullTokenizer (datasets/megatron_tokenizer.h)
  std::string tokenizer_type = "GPT2BPETokenizer";
  std::string tokenizer_model;  // HuggingFaceTokenizer: a directory with tokenizer.json; SentencePiece: the .model
  std::string vocab_file;
  std::string merge_file;
  bool eod_mask_loss = false;  // --eod-mask-loss: no loss where the input token is EOD
  // Packed documents (transformer/packed_seq_params.h; documents end after each EOD token of a sample, as Megatron's
  // _get_ltor_masks_and_position_ids): positions restart per document / each document attends only within itself.
  bool reset_position_ids = false;    // --reset-position-ids
  bool reset_attention_mask = false;  // --reset-attention-mask
  // --sft: data paths are JSONL conversations (datasets/sft_dataset.h), packed; always with both resets, from the
  // conversations' own boundaries. The prompt format renders them (datasets/sft_conversation.h).
  bool sft = false;
  std::string sft_tokenizer_prompt_format = "nemotron-h-aligned";  // --sft-tokenizer-prompt-format
  bool packed_sequences() const { return sft || reset_position_ids || reset_attention_mask; }

  // Megatron's parse of --split: ',' or '/' separated weights, padded to 3 with 0, normalized to sum 1.
  std::array<double, 3> split_fractions() const;
  static const config::FieldTable<DataConfig>& fields();
  void validate() const;
};

}  // namespace mcpp
