// BlendedDataset — Megatron-Core's data blend (megatron/core/datasets/blended_megatron_dataset_builder.py and
// blended_dataset.py) over GPTDatasets, for `--data-path 0.3 A 0.7 B`:
//   parse_data_blend: Megatron's get_blend_from_list — an even-length list whose even entries are all numbers is
//     (weight, prefix) pairs, the weights normalized to sum 1; a single prefix is used as is (no blend); several
//     prefixes without weights are a blend weighed by their sizes (below); a mix of numbers and prefixes is refused
//     by name.
//   Per split with a target of N samples, dataset d is a GPTDataset of the same split, seq_length and seed with
//     num_samples = ceil(ceil(N * w_d) * 1.005) (Megatron's _get_size_per_split_per_dataset, 0.5% surplus), and the
//     blend's sample i is sample dataset_sample_index[i] of dataset dataset_index[i], both from
//     build_blending_indices (Megatron's helpers.cpp): sample i goes to the dataset whose count lags its share
//     w_d * max(i, 1) the most (the first such on ties), so every prefix of the order holds each dataset in
//     proportion to its weight within one sample.
// Several prefixes without weights (Megatron's BlendedMegatronDatasetBuilder with weights None): each dataset is one
//   epoch of its split (GPTDataset num_samples 0: Megatron's num_samples None, not resized), the weights are those
//   datasets' sample counts, and the blend holds min(N, their sum) samples in build_blending_indices' order — fewer
//   than N is refused by name here (Megatron's sampler would run dry mid-training).
// A single unweighted prefix is that prefix's GPTDataset itself (same size and order: Megatron builds no blend).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mcpp/datasets/gpt_dataset.h"
#include "mcpp/datasets/megatron_dataset.h"

namespace mcpp {

struct DataBlend {
  std::vector<std::string> prefixes;
  std::vector<double> weights;  // normalized; empty: one prefix (no blend), or weighed by size
  bool by_size = false;         // several prefixes without weights: weighed by their datasets' sizes
};
// data_path as given to --data-path (TOML: data_path = ["0.3", "A", "0.7", "B"]). Errors name `field`.
DataBlend parse_data_blend(const std::vector<std::string>& data_path, const char* field = "data_path");

// Megatron's per-dataset sample count for a split's target: ceil(ceil(target * weight) * 1.005).
int64_t blended_dataset_samples(int64_t target, double weight);

// Megatron's build_blending_indices for `size` samples over weights (normalized): dataset_index[i] (int16) and
// dataset_sample_index[i] (the running count of that dataset before sample i).
void build_blending_indices(std::vector<int16_t>& dataset_index, std::vector<int64_t>& dataset_sample_index,
                            const std::vector<double>& weights, int64_t size);

class BlendedDataset final : public MegatronDataset {
 public:
  // opt: the split, seq_length, seed, EOD masking and num_samples (the split's target N) every dataset shares;
  // opt.prefix is ignored (the blend's prefixes are).
  BlendedDataset(const DataBlend& blend, const GPTDatasetOptions& opt);

  int64_t size() const override;  // N blended; a single prefix: its GPTDataset's size (>= N)
  void sample(int64_t i, std::span<int32_t> tokens /*[seq+1]*/, std::span<float> loss_mask /*[seq]*/) const override;
  const std::string& prefix_of(int64_t i) const override;  // the prefix sample i is read from (for error messages)
  const std::vector<std::unique_ptr<GPTDataset>>& datasets() const { return datasets_; }
  const std::vector<int16_t>& dataset_index() const { return dataset_index_; }
  const std::vector<int64_t>& dataset_sample_index() const { return dataset_sample_index_; }

 private:
  void check_indices() const;  // every blended sample within its dataset
  DataBlend blend_;
  bool single_ = false;  // one prefix without a weight: its dataset itself
  std::vector<std::unique_ptr<GPTDataset>> datasets_;
  std::vector<int16_t> dataset_index_;
  std::vector<int64_t> dataset_sample_index_;
};

}  // namespace mcpp
