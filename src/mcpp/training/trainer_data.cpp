// Trainer data (trainer.h): the train / valid / test datasets (Megatron's build_train_valid_test_datasets: the
// --data-path prefix or blend split by --split, or one prefix or blend per split) and the microbatches of a global
// batch (Megatron's pretraining sampler: DP rank r takes rows [r * mbs, (r + 1) * mbs) of each mbs * dp slice; with
// context parallelism this CP rank's rows of every sample). Host tensors [s, b]; the model moves them to its device.
// With --sft the split's JSONL conversations, packed (datasets/sft_dataset.h). Packed sequences (--sft,
// --reset-position-ids, --reset-attention-mask): each microbatch carries its documents (PackedSeqParams) — the SFT
// dataset's own boundaries, else Megatron's: a document ends after each EOD token. A training microbatch (training:
// not evaluation) passes --inject-fault bad-batch and, when --check-data-consistency is due, is hashed
// (data_consistency.h).
#include <spdlog/spdlog.h>

#include "mcpp/core/error.h"
#include "mcpp/datasets/blended_dataset.h"
#include "mcpp/datasets/sft_dataset.h"
#include "mcpp/training/data_consistency.h"
#include "mcpp/training/fault_injection.h"
#include "mcpp/training/trainer.h"
#include "mcpp/transformer/context_parallel.h"

namespace mcpp {
namespace {

std::unique_ptr<MegatronDataset> make_dataset(const Config& c, int split, int64_t num_samples, int64_t eod) {
  const std::vector<std::string>* per_split[] = {&c.data.train_data_path, &c.data.valid_data_path,
                                                 &c.data.test_data_path};
  const char* fields[] = {"train_data_path", "valid_data_path", "test_data_path"};
  const char* whole[] = {"1,0,0", "0,1,0", "0,0,1"};  // Megatron's split of a per-split blend: all of it
  const bool own = c.data.data_path.empty();
  if (own && per_split[split]->empty()) return nullptr;
  if (c.data.sft) {
    const auto tokenizer = build_tokenizer({.tokenizer_type = c.data.tokenizer_type,
                                            .tokenizer_model = c.data.tokenizer_model,
                                            .vocab_file = c.data.vocab_file,
                                            .merge_file = c.data.merge_file,
                                            .vocab_size = c.model.vocab_size});
    return std::make_unique<SFTDataset>(
        SFTDatasetOptions{.path = own ? per_split[split]->front() : c.data.data_path.front(),
                          .split = own ? whole[split] : c.data.split,
                          .split_index = split,
                          .seq_length = c.model.seq_length,
                          .prompt_format = c.data.sft_tokenizer_prompt_format,
                          .tokenizer = tokenizer.get()});
  }
  const GPTDatasetOptions opt{.prefix = {},  // (the blend's)
                              .split = own ? whole[split] : c.data.split,
                              .split_index = split,
                              .seq_length = c.model.seq_length,
                              .num_samples = num_samples,
                              .seed = static_cast<uint32_t>(c.training.seed),
                              .eod_token = eod,
                              .eod_mask_loss = c.data.eod_mask_loss};
  return std::make_unique<BlendedDataset>(
      own ? parse_data_blend(*per_split[split], fields[split]) : parse_data_blend(c.data.data_path), opt);
}

}  // namespace

void Trainer::build_datasets(int64_t eod_token) {
  const auto& t = config_.training;
  const int64_t gbs = t.global_batch_size;
  eod_token_ = eod_token;
  // Megatron's train_val_test_num_samples: train_samples when sample-based (its last, partial batch never trained)
  const int64_t train_samples = t.train_samples > 0 ? t.train_samples : t.train_iters * gbs;
  train_ds_ = make_dataset(config_, 0, train_samples, eod_token);
  if (!train_ds_) fail("data_path: training needs --data-path (or --train-data-path)");
  if (t.eval_iters > 0 && t.eval_interval > 0) {
    const int64_t eval_samples = (t.train_iters / t.eval_interval + 1) * t.eval_iters * gbs;
    valid_ds_ = make_dataset(config_, 1, eval_samples, eod_token);
  }
  // Megatron's test split: eval_iters global batches, evaluated once after training, when the split has a weight
  // (--split's third) or a path of its own (--test-data-path). One too small for a sample skips that evaluation
  // with a warning naming why (the default --split 969,30,1 of a small corpus), rather than failing the run.
  const bool has_test = config_.data.data_path.empty() ? !config_.data.test_data_path.empty()
                                                       : parse_split(config_.data.split)[2] > 0.0;
  if (t.eval_iters > 0 && has_test) {
    try {
      test_ds_ = make_dataset(config_, 2, t.eval_iters * gbs, eod_token);
    } catch (const Error& e) {
      if (!config_.data.test_data_path.empty()) throw;  // its own path: the user asked for this split
      if (is_logging_rank()) spdlog::warn("no test evaluation at the end of training: {}", e.what());
    }
  }
}

Trainer::Batch Trainer::get_batch(const MegatronDataset& ds, int64_t first, int64_t m, bool training) {
  // Megatron's pretraining sampler: the global batch is num_microbatches slices of mbs * dp samples;
  // DP rank r takes rows [r * mbs, (r + 1) * mbs) of each slice. Past the end, the order repeats.
  const int64_t b = config_.training.micro_batch_size, s = config_.model.seq_length;
  const int64_t base = first + m * b * pc_.dp_size() + pc_.dp_rank() * b;
  Batch batch{Tensor::empty({s, b}, DType::I32), Tensor::empty({s, b}, DType::I32), Tensor::empty({s, b}), {}};
  std::vector<int32_t> tokens(static_cast<size_t>(s + 1));
  std::vector<float> mask(static_cast<size_t>(s));
  const int64_t vocab = config_.model.padded_vocab_size;
  std::vector<std::vector<int32_t>> documents;  // packed sequences: each sample's cu_seqlens
  for (int64_t ib = 0; ib < b; ++ib) {
    const int64_t index = (base + ib) % ds.size();
    ds.sample(index, tokens, mask);
    if (config_.data.packed_sequences()) documents.push_back(ds.documents(index));
    for (int32_t t : tokens)  // checked here for every backend: the CUDA loss reports a bad id only as NaN
      if (t < 0 || t >= vocab)
        fail("data: sample {} of the dataset '{}' holds token id {}, outside the model's vocabulary [0, {}) "
             "(a data file made with another tokenizer, or --vocab-size too small)",
             index, ds.prefix_of(index), t, vocab);
    for (int64_t i = 0; i < s; ++i) {  // sample ib is column ib of the [s, b] layout
      batch.tokens.data<int32_t>()[i * b + ib] = tokens[i];
      batch.labels.data<int32_t>()[i * b + ib] = tokens[i + 1];
      batch.loss_mask.data<float>()[i * b + ib] = mask[i];
    }
  }
  if (config_.data.packed_sequences()) {  // the dataset's own documents (SFT), else Megatron's: ended by EOD
    const std::vector<std::vector<int32_t>> by_eod = cu_seqlens_from_eod(batch.tokens, eod_token_);
    for (size_t ib = 0; ib < documents.size(); ++ib)
      if (documents[ib].empty()) documents[ib] = by_eod[ib];
    batch.packed = packed_seq_params_from_cu_seqlens(
        documents, s,
        {.reset_position_ids = config_.data.sft || config_.data.reset_position_ids,
         .reset_attention_mask = config_.data.sft || config_.data.reset_attention_mask});
  }
  if (training && faults_)  // --inject-fault bad-batch
    faults_->perturb_batch(step_iteration_, m, batch.tokens, vocab);
  if (training && data_digests_)  // --check-data-consistency: the whole samples, before the CP split
    data_digests_->push_back({.hash = microbatch_hash(batch.tokens, batch.labels, batch.loss_mask,
                                                      batch.packed.position_ids),
                              .first_sample = base,
                              .dataset_index = base % ds.size()});
  if (pc_.cp_size() == 1) return batch;
  // Context parallelism: this CP rank's rows of every sample (context_parallel.h: a contiguous s / cp chunk, or
  // the ring attention's load-balanced chunks r and 2cp-1-r).
  const std::vector<CpRows> rows =
      cp_rows(s, pc_.cp_size(), pc_.cp_rank(), config_.parallel.cp_ring());
  return {cp_take_rows(batch.tokens, rows), cp_take_rows(batch.labels, rows), cp_take_rows(batch.loss_mask, rows), {}};
}

}  // namespace mcpp
