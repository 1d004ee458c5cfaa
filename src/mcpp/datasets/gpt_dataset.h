// GPTDataset — Megatron-Core's GPT pretraining dataset (megatron/core/datasets/gpt_dataset.py) over
// an IndexedDataset.
//
// Split: the split string ("969,30,1") is normalized and turned into element ranges as Megatron-Core does
// since core_r0.5: each cumulative bookend rounded on its own, int(round(bookend * N)) (Python round =
// round-half-even).
// As in Megatron-Core, the elements are the indexed dataset's *sequences* (one per document when
// written by `mcpp data preprocess`).
// Indices, built in memory on construction (Megatron caches them as .npy files; we rebuild — it is
// a linear pass):
//   num_epochs      smallest E with E * tokens_in_split >= num_samples * seq_length + 1
//   document_index  [E * split_size] int32 sequence ids, each epoch a copy of the split's ids, shuffled
//                   globally (the final epoch shuffled on its own when it supplies < 80% of an
//                   epoch's samples: Megatron's separate_final_epoch)
//   sample_index    [(size + 1) * 2] (position in document_index, token offset) where each sample
//                   starts; consecutive samples share one token (helpers.cpp build_sample_idx with
//                   add_extra_token_to_sequence = 1, drop_last_partial_sequence = true)
//   shuffle_index   [size] a permutation of the samples (first E-1 epochs' and the final epoch's
//                   samples permuted separately when separate_final_epoch)
// Randomness: numpy.random.RandomState(seed) reproduced bit for bit (numpy_random.h), used in the
// same order as Megatron (document index, then shuffle index), so for the same data, split, seq_length,
// num_samples and seed the sample order equals Megatron's. (Like Megatron, every split uses the same
// seed; the splits draw different sequences.)
// Sample i: tokens[seq_length + 1] int32 — the trainer feeds tokens[:-1] as inputs and tokens[1:] as
// labels — and loss_mask[seq_length] float: 1, or 0 where the *input* token is EOD and eod_mask_loss
// is set (Megatron's _get_ltor_masks_and_position_ids).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mcpp/datasets/indexed_dataset.h"

namespace mcpp {

struct GPTDatasetOptions {
  std::string prefix;           // <prefix>.idx / <prefix>.bin
  std::string split = "969,30,1";
  int split_index = 0;          // 0 train, 1 valid, 2 test
  int64_t seq_length = 0;
  int64_t num_samples = 0;      // samples wanted; 0 = one epoch (Megatron's num_samples=None)
  uint32_t seed = 1234;         // Megatron's --seed (numpy seeds are 32-bit)
  int64_t eod_token = -1;       // used only by eod_mask_loss
  bool eod_mask_loss = false;
  void validate() const;        // names the field at fault
};

// Megatron's parse_and_normalize_split: up to three non-negative weights, normalized to sum 1.
std::array<double, 3> parse_split(const std::string& split);
// Megatron-Core's split bookends over num_elements: [0, end_train, end_valid, end_test] with
// end = int(round(cumulative_weight * num_elements)) (blended_megatron_dataset_builder.py).
std::array<int64_t, 4> split_indices(const std::string& split, int64_t num_elements);
const char* split_name(int split_index);  // "train", "valid", "test"

struct GPTSample {
  std::vector<int32_t> tokens;  // [seq_length + 1]
  std::vector<float> loss_mask;  // [seq_length]
};

class GPTDataset {
 public:
  explicit GPTDataset(const GPTDatasetOptions& opt);  // opens opt.prefix
  GPTDataset(std::shared_ptr<const IndexedDataset> data, const GPTDatasetOptions& opt);

  int64_t size() const { return static_cast<int64_t>(shuffle_index_.size()); }  // >= num_samples
  int64_t seq_length() const { return opt_.seq_length; }
  int64_t num_epochs() const { return num_epochs_; }
  int64_t split_begin() const { return split_begin_; }  // sequence range of this split
  int64_t split_end() const { return split_end_; }
  int64_t tokens_per_epoch() const { return tokens_per_epoch_; }
  bool separate_final_epoch() const { return separate_final_epoch_; }
  const GPTDatasetOptions& options() const { return opt_; }
  const IndexedDataset& indexed() const { return *data_; }

  // Sample i (0 <= i < size()) of the shuffled order.
  void sample(int64_t i, std::span<int32_t> tokens /*[seq+1]*/, std::span<float> loss_mask /*[seq]*/) const;
  GPTSample sample(int64_t i) const;

  const std::vector<int32_t>& document_index() const { return document_index_; }
  const std::vector<int64_t>& sample_index() const { return sample_index_; }
  const std::vector<int64_t>& shuffle_index() const { return shuffle_index_; }

 private:
  void build();
  void build_sample_index(const std::vector<int32_t>& lengths);

  GPTDatasetOptions opt_;
  std::shared_ptr<const IndexedDataset> data_;
  int64_t split_begin_ = 0, split_end_ = 0, tokens_per_epoch_ = 0, num_epochs_ = 0;
  bool separate_final_epoch_ = false;
  std::vector<int32_t> document_index_;
  std::vector<int64_t> sample_index_;
  std::vector<int64_t> shuffle_index_;
};

// Position in the global sample order, for resuming: a cursor built at consumed_samples = k yields
// samples k, k+1, ... exactly as a fresh cursor does after k next() calls. Past size() it wraps to
// sample 0 (a second pass over the same order); the trainer sizes num_samples so that this does not
// happen in a normal run.
class GPTSampleCursor {
 public:
  GPTSampleCursor(const GPTDataset& ds, int64_t consumed_samples);
  void next(std::span<int32_t> tokens /*[seq+1]*/, std::span<float> loss_mask /*[seq]*/);
  int64_t consumed_samples() const { return consumed_; }

 private:
  const GPTDataset* ds_;
  int64_t consumed_;
};

}  // namespace mcpp
