// BlendedDataset; contract in blended_dataset.h.
#include "mcpp/datasets/blended_dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include <fmt/ranges.h>

#include "mcpp/core/error.h"

namespace mcpp {
namespace {
// A weight entry: the whole string a finite number (Python's float(), without its inf / nan spellings).
bool parse_weight(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v)) return false;
  *out = v;
  return true;
}
}  // namespace

DataBlend parse_data_blend(const std::vector<std::string>& data_path, const char* field) {
  if (data_path.empty()) fail("{}: no prefix", field);
  DataBlend blend;
  if (data_path.size() % 2 == 0) {
    std::vector<double> weights;
    size_t numbers = 0;
    for (size_t i = 0; i < data_path.size(); i += 2) {
      double w = 0;
      if (parse_weight(data_path[i], &w)) ++numbers, weights.push_back(w);
    }
    if (numbers == data_path.size() / 2) {
      double sum = 0;
      for (size_t k = 0; k < weights.size(); ++k) {
        if (!(weights[k] > 0))
          fail("{}: the weight of '{}' is {}; blend weights must be positive", field, data_path[2 * k + 1],
               weights[k]);
        sum += weights[k];
      }
      for (size_t i = 1; i < data_path.size(); i += 2) blend.prefixes.push_back(data_path[i]);
      for (double w : weights) blend.weights.push_back(w / sum);
      if (blend.prefixes.size() > std::numeric_limits<int16_t>::max())
        fail("{}: {} prefixes exceed the blend's int16 dataset index", field, blend.prefixes.size());
      return blend;
    }
    if (numbers > 0)
      fail("{}: '{}' mixes weights and prefixes; give 'weight prefix' pairs or prefixes alone", field,
           fmt::join(data_path, " "));
  }
  if (data_path.size() > 1) {  // Megatron: the prefixes weighed by their sizes
    for (const std::string& p : data_path) {
      double w = 0;
      if (parse_weight(p, &w))
        fail("{}: '{}' mixes weights and prefixes; give 'weight prefix' pairs or prefixes alone", field,
             fmt::join(data_path, " "));
    }
    if (data_path.size() > static_cast<size_t>(std::numeric_limits<int16_t>::max()))
      fail("{}: {} prefixes exceed the blend's int16 dataset index", field, data_path.size());
    blend.by_size = true;
  }
  blend.prefixes = data_path;
  return blend;
}

int64_t blended_dataset_samples(int64_t target, double weight) {
  return static_cast<int64_t>(std::ceil(std::ceil(static_cast<double>(target) * weight) * 1.005));
}

void build_blending_indices(std::vector<int16_t>& dataset_index, std::vector<int64_t>& dataset_sample_index,
                            const std::vector<double>& weights, int64_t size) {
  dataset_index.assign(static_cast<size_t>(size), 0);
  dataset_sample_index.assign(static_cast<size_t>(size), 0);
  std::vector<int64_t> current(weights.size(), 0);
  for (int64_t i = 0; i < size; ++i) {
    const double n = std::max(static_cast<double>(i), 1.0);
    size_t best = 0;
    double best_error = weights[0] * n - static_cast<double>(current[0]);
    for (size_t d = 1; d < weights.size(); ++d) {
      const double error = weights[d] * n - static_cast<double>(current[d]);
      if (error > best_error) best_error = error, best = d;
    }
    dataset_index[static_cast<size_t>(i)] = static_cast<int16_t>(best);
    dataset_sample_index[static_cast<size_t>(i)] = current[best]++;
  }
}

BlendedDataset::BlendedDataset(const DataBlend& blend, const GPTDatasetOptions& opt) : blend_(blend) {
  MCPP_CHECK(!blend_.prefixes.empty(), "BlendedDataset: no prefixes");
  if (blend_.by_size) {  // one epoch of each, weighed by those sizes (Megatron's weights None)
    int64_t total = 0;
    for (const std::string& prefix : blend_.prefixes) {
      GPTDatasetOptions o = opt;
      o.prefix = prefix;
      o.num_samples = 0;
      datasets_.push_back(std::make_unique<GPTDataset>(o));
      total += datasets_.back()->size();
    }
    for (const auto& ds : datasets_)
      blend_.weights.push_back(static_cast<double>(ds->size()) / static_cast<double>(total));
    if (opt.num_samples > total)
      fail("data: the blend of {} prefixes without weights holds {} samples of {} tokens (one epoch of each: "
           "Megatron's rule) but the {} split needs {}; give 'weight prefix' pairs (each prefix then repeats to its "
           "share) or train fewer samples",
           blend_.prefixes.size(), total, opt.seq_length, split_name(static_cast<int>(opt.split_index)),
           opt.num_samples);
    build_blending_indices(dataset_index_, dataset_sample_index_, blend_.weights,
                           opt.num_samples > 0 ? opt.num_samples : total);
    check_indices();
    return;
  }
  if (blend_.weights.empty()) {  // one prefix: its dataset as is
    single_ = true;
    GPTDatasetOptions o = opt;
    o.prefix = blend_.prefixes.front();
    datasets_.push_back(std::make_unique<GPTDataset>(o));
    return;
  }
  MCPP_CHECK(blend_.weights.size() == blend_.prefixes.size(), "BlendedDataset: {} weights for {} prefixes",
             blend_.weights.size(), blend_.prefixes.size());
  if (opt.num_samples <= 0) fail("data: a blend needs the split's sample count (num_samples {})", opt.num_samples);
  for (size_t d = 0; d < blend_.prefixes.size(); ++d) {
    GPTDatasetOptions o = opt;
    o.prefix = blend_.prefixes[d];
    o.num_samples = blended_dataset_samples(opt.num_samples, blend_.weights[d]);
    datasets_.push_back(std::make_unique<GPTDataset>(o));
  }
  build_blending_indices(dataset_index_, dataset_sample_index_, blend_.weights, opt.num_samples);
  check_indices();
}

void BlendedDataset::check_indices() const {
  for (size_t i = 0; i < dataset_index_.size(); ++i) {  // Megatron's surplus covers the greedy's lead; checked
    const GPTDataset& ds = *datasets_[static_cast<size_t>(dataset_index_[i])];
    MCPP_CHECK(dataset_sample_index_[i] < ds.size(), "BlendedDataset: sample {} reads sample {} of '{}' ({} built)",
               i, dataset_sample_index_[i], ds.options().prefix, ds.size());
  }
}

int64_t BlendedDataset::size() const {
  return single_ ? datasets_.front()->size() : static_cast<int64_t>(dataset_index_.size());
}

void BlendedDataset::sample(int64_t i, std::span<int32_t> tokens, std::span<float> loss_mask) const {
  if (single_) return datasets_.front()->sample(i, tokens, loss_mask);
  MCPP_CHECK(i >= 0 && i < size(), "BlendedDataset: sample {} of {}", i, size());
  const auto k = static_cast<size_t>(i);
  datasets_[static_cast<size_t>(dataset_index_[k])]->sample(dataset_sample_index_[k], tokens, loss_mask);
}

const std::string& BlendedDataset::prefix_of(int64_t i) const {
  if (single_) return blend_.prefixes.front();
  return blend_.prefixes[static_cast<size_t>(dataset_index_[static_cast<size_t>(i)])];
}

}  // namespace mcpp
