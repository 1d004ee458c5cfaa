// GPTDataset: split ranges, document / sample / shuffle indices and sample assembly; contract in
// gpt_dataset.h.
#include "mcpp/datasets/gpt_dataset.h"

#include <cmath>
#include <cstdlib>
#include <limits>

#include "mcpp/core/error.h"
#include "mcpp/datasets/numpy_random.h"

namespace mcpp {

namespace {
constexpr int64_t kMaxIndexEntries = int64_t{1} << 34;  // refuse absurd num_samples before allocating
}

const char* split_name(int split_index) {
  switch (split_index) {
    case 0: return "train";
    case 1: return "valid";
    case 2: return "test";
  }
  return "?";
}

std::array<double, 3> parse_split(const std::string& split) {
  std::array<double, 3> w{0.0, 0.0, 0.0};
  size_t n = 0, at = 0;
  if (split.empty()) fail("split: empty string (expected up to three weights, e.g. \"969,30,1\")");
  while (at <= split.size()) {
    size_t end = split.find_first_of(",/", at);
    if (end == std::string::npos) end = split.size();
    const std::string part = split.substr(at, end - at);
    if (n == 3) fail("split '{}': more than three weights (train, valid, test)", split);
    char* stop = nullptr;
    const double v = part.empty() ? -1.0 : std::strtod(part.c_str(), &stop);
    if (part.empty() || stop != part.c_str() + part.size() || !(v >= 0.0) || !std::isfinite(v))
      fail("split '{}': weight '{}' is not a non-negative number", split, part);
    w[n++] = v;
    at = end + 1;
  }
  const double sum = w[0] + w[1] + w[2];
  if (!(sum > 0.0)) fail("split '{}': the weights sum to 0", split);
  for (double& x : w) x /= sum;
  return w;
}

std::array<int64_t, 4> split_indices(const std::string& split, int64_t num_elements) {
  const auto w = parse_split(split);
  // Megatron-Core since core_r0.5: the split matrix's cumulative bookends [0, w0, w0+w1, w0+w1+w2]
  // (convert_split_vector_to_split_matrix, summed left to right in float64), each scaled and rounded on its
  // own: int(round(bookend * N)) in BlendedMegatronDatasetBuilder. Python's round() is round-half-to-even,
  // as nearbyint in the default rounding mode.
  std::array<int64_t, 4> idx{0, 0, 0, 0};
  double bookend = 0.0;
  for (int k = 0; k < 3; ++k) {
    bookend += w[k];
    idx[k + 1] = static_cast<int64_t>(std::nearbyint(bookend * static_cast<double>(num_elements)));
  }
  return idx;
}

void GPTDatasetOptions::validate() const {
  if (prefix.empty()) fail("data: prefix (--data-path) is empty");
  if (split_index < 0 || split_index > 2) fail("data: split_index {} must be 0 (train), 1 (valid) or 2 (test)", split_index);
  parse_split(split);
  if (seq_length < 1) fail("data: seq_length {} must be >= 1", seq_length);
  if (num_samples < 0) fail("data: num_samples {} must be >= 0 (0 = one epoch)", num_samples);
  if (eod_mask_loss && eod_token < 0) fail("data: eod_mask_loss needs eod_token (got {})", eod_token);
}

GPTDataset::GPTDataset(const GPTDatasetOptions& opt)
    : GPTDataset([&] {
        opt.validate();
        return std::make_shared<const IndexedDataset>(IndexedDataset::open(opt.prefix));
      }(),
                 opt) {}

GPTDataset::GPTDataset(std::shared_ptr<const IndexedDataset> data, const GPTDatasetOptions& opt)
    : opt_(opt), data_(std::move(data)) {
  opt_.validate();
  MCPP_CHECK(data_ != nullptr, "GPTDataset: no indexed dataset");
  build();
}

void GPTDataset::build() {
  const std::string& prefix = data_->prefix();
  const int64_t nseq = data_->num_sequences();
  if (nseq >= std::numeric_limits<int32_t>::max())
    fail("{}: {} sequences exceed the int32 document index", prefix, nseq);
  const auto bounds = split_indices(opt_.split, nseq);
  split_begin_ = bounds[static_cast<size_t>(opt_.split_index)];
  split_end_ = bounds[static_cast<size_t>(opt_.split_index) + 1];
  const char* name = split_name(opt_.split_index);
  if (split_end_ <= split_begin_)
    fail("{}: split '{}' leaves the {} split empty ({} sequences in the dataset)", prefix, opt_.split, name, nseq);

  const std::vector<int32_t> lengths = data_->sequence_lengths();
  tokens_per_epoch_ = 0;
  for (int64_t q = split_begin_; q < split_end_; ++q) tokens_per_epoch_ += lengths[static_cast<size_t>(q)];
  const int64_t s = opt_.seq_length;
  if (tokens_per_epoch_ < 2)
    fail("{}: the {} split has {} tokens; a sample needs seq_length + 1 = {}", prefix, name, tokens_per_epoch_, s + 1);

  // Megatron's _get_num_epochs: smallest E with E * tokens >= num_samples * s + 1.
  num_epochs_ = 1;
  if (opt_.num_samples > 0) {
    const int64_t requested = opt_.num_samples * s + 1;
    num_epochs_ = std::max<int64_t>(1, (requested + tokens_per_epoch_ - 1) / tokens_per_epoch_);
  }
  const int64_t split_size = split_end_ - split_begin_;
  if (num_epochs_ > kMaxIndexEntries / split_size ||
      (num_epochs_ * tokens_per_epoch_ - 1) / s > kMaxIndexEntries)
    fail("{}: num_samples {} needs {} epochs of the {} split; the indices would be too large", prefix,
         opt_.num_samples, num_epochs_, name);
  const int64_t n = (num_epochs_ * tokens_per_epoch_ - 1) / s;
  if (n == 0)
    fail("{}: the {} split has {} tokens, fewer than seq_length + 1 = {}", prefix, name, tokens_per_epoch_, s + 1);

  separate_final_epoch_ = false;
  int64_t samples_sans_final = 0;
  if (num_epochs_ > 1) {
    samples_sans_final = ((num_epochs_ - 1) * tokens_per_epoch_ - 1) / s;
    const int64_t from_final = opt_.num_samples - samples_sans_final;
    const int64_t per_epoch = (tokens_per_epoch_ - 1) / s;
    MCPP_CHECK(from_final >= 0 && from_final <= per_epoch + 1, "final-epoch sample count {} outside [0, {}]",
               from_final, per_epoch + 1);
    separate_final_epoch_ = from_final < static_cast<int64_t>(0.80 * static_cast<double>(per_epoch));
  }

  NumpyRandomState rng(opt_.seed);
  // Document index: each epoch a copy of the split's sequence ids, shuffled.
  document_index_.resize(static_cast<size_t>(num_epochs_ * split_size));
  for (int64_t e = 0; e < num_epochs_; ++e)
    for (int64_t q = 0; q < split_size; ++q)
      document_index_[static_cast<size_t>(e * split_size + q)] = static_cast<int32_t>(split_begin_ + q);
  std::span<int32_t> docs(document_index_);
  if (separate_final_epoch_) {
    const auto first = static_cast<size_t>((num_epochs_ - 1) * split_size);
    rng.shuffle(docs.subspan(0, first));
    rng.shuffle(docs.subspan(first));
  } else {
    rng.shuffle(docs);
  }

  build_sample_index(lengths);

  shuffle_index_.resize(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) shuffle_index_[static_cast<size_t>(k)] = k;
  std::span<int64_t> sh(shuffle_index_);
  if (separate_final_epoch_) {
    rng.shuffle(sh.subspan(0, static_cast<size_t>(samples_sans_final)));
    rng.shuffle(sh.subspan(static_cast<size_t>(samples_sans_final)));
  } else {
    rng.shuffle(sh);
  }
}

// helpers.cpp build_sample_idx (add_extra_token_to_sequence = 1, drop_last_partial_sequence = true):
// walk the flattened document_index, s tokens per sample, each sample also taking the next sample's
// first token. Entry k = (position in document_index, token offset) where sample k starts.
void GPTDataset::build_sample_index(const std::vector<int32_t>& lengths) {
  const int64_t s = opt_.seq_length;
  const int64_t n = (num_epochs_ * tokens_per_epoch_ - 1) / s;
  const auto last = static_cast<int64_t>(document_index_.size()) - 1;
  sample_index_.assign(static_cast<size_t>(2 * (n + 1)), 0);
  int64_t di = 0, off = 0;
  for (int64_t k = 1; k <= n; ++k) {
    int64_t remaining = s + 1;
    while (remaining != 0) {
      const int64_t doc_len = lengths[static_cast<size_t>(document_index_[static_cast<size_t>(di)])] - off;
      remaining -= doc_len;
      if (remaining <= 0) {
        off += remaining + doc_len - 1;  // the last token is also the next sample's first
        remaining = 0;
      } else {
        // n was chosen so that the tokens suffice; running out would be a bug here.
        MCPP_CHECK(di < last, "sample index ran out of tokens at sample {} of {}", k, n);
        ++di;
        off = 0;
      }
    }
    sample_index_[static_cast<size_t>(2 * k)] = di;
    sample_index_[static_cast<size_t>(2 * k + 1)] = off;
  }
}

void GPTDataset::sample(int64_t i, std::span<int32_t> tokens, std::span<float> loss_mask) const {
  const int64_t s = opt_.seq_length;
  if (i < 0 || i >= size()) fail("{}: sample {} out of range (the {} split has {})", data_->prefix(), i, split_name(opt_.split_index), size());
  if (static_cast<int64_t>(tokens.size()) != s + 1 || static_cast<int64_t>(loss_mask.size()) != s)
    fail("GPTDataset::sample: buffers of {} tokens and {} mask entries, expected {} and {}", tokens.size(),
         loss_mask.size(), s + 1, s);
  const auto j = static_cast<size_t>(shuffle_index_[static_cast<size_t>(i)]);
  const int64_t d0 = sample_index_[2 * j], o0 = sample_index_[2 * j + 1];
  const int64_t d1 = sample_index_[2 * j + 2], o1 = sample_index_[2 * j + 3];
  int64_t at = 0;
  for (int64_t d = d0; d <= d1; ++d) {
    const int64_t q = document_index_[static_cast<size_t>(d)];
    const int64_t off = d == d0 ? o0 : 0;
    const int64_t len = d < d1 ? data_->sequence_length(q) - off : o1 + 1 - off;
    MCPP_CHECK(len >= 0 && at + len <= s + 1, "sample {} overflows: {} + {} tokens", i, at, len);
    data_->read(q, off, len, tokens.data() + at);
    at += len;
  }
  MCPP_CHECK(at == s + 1, "sample {} assembled {} tokens, expected {}", i, at, s + 1);
  for (int64_t k = 0; k < s; ++k)
    loss_mask[static_cast<size_t>(k)] = opt_.eod_mask_loss && tokens[static_cast<size_t>(k)] == opt_.eod_token ? 0.0f : 1.0f;
}

GPTSample GPTDataset::sample(int64_t i) const {
  GPTSample out;
  out.tokens.resize(static_cast<size_t>(opt_.seq_length + 1));
  out.loss_mask.resize(static_cast<size_t>(opt_.seq_length));
  sample(i, out.tokens, out.loss_mask);
  return out;
}

GPTSampleCursor::GPTSampleCursor(const GPTDataset& ds, int64_t consumed_samples)
    : ds_(&ds), consumed_(consumed_samples) {
  if (consumed_samples < 0) fail("data: consumed_samples {} must be >= 0", consumed_samples);
}

void GPTSampleCursor::next(std::span<int32_t> tokens, std::span<float> loss_mask) {
  ds_->sample(consumed_ % ds_->size(), tokens, loss_mask);
  ++consumed_;
}

}  // namespace mcpp
