// MegatronDataset — what the trainer reads samples from (Megatron-Core's MegatronDataset base of GPTDataset and
// the SFT dataset): size(), sample i as tokens [seq_length + 1] (inputs tokens[:-1], labels tokens[1:]) and
// loss_mask [seq_length], and where sample i comes from (error messages). Implemented by BlendedDataset (pretraining
// data: one GPTDataset or a blend) and SFTDataset (--sft JSONL conversations, packed).
// documents(i): sample i's document boundaries over its seq_length input positions (cu_seqlens, packed_seq_params.h)
// when the dataset packs documents itself (SFT); empty when it does not know them (pretraining data: with
// --reset-position-ids / --reset-attention-mask the trainer finds them at EOD tokens, as Megatron).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace mcpp {

class MegatronDataset {
 public:
  virtual ~MegatronDataset() = default;
  virtual int64_t size() const = 0;
  virtual void sample(int64_t i, std::span<int32_t> tokens /*[seq+1]*/, std::span<float> loss_mask /*[seq]*/) const = 0;
  virtual std::vector<int32_t> documents(int64_t /*i*/) const { return {}; }
  virtual const std::string& prefix_of(int64_t i) const = 0;  // the file / prefix sample i is read from
};

}  // namespace mcpp
