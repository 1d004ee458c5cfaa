// DataConfig's field table, split and validate(); contract in data_config.h.
#include "mcpp/datasets/data_config.h"

#include <cmath>
#include <cstdlib>
#include <utility>

#include "mcpp/core/error.h"
#include "mcpp/datasets/blended_dataset.h"
#include "mcpp/datasets/sft_conversation.h"

namespace mcpp {

// The data changes no value a checkpoint's model computes: the table's default fingerprint is Never.
const config::FieldTable<DataConfig>& DataConfig::fields() {
  using Self = DataConfig;
  const std::string split_help =
      "this split's prefix or blend (instead of --data-path and --split; the test split is evaluated once at the end "
      "of training)";
  static const config::FieldTable<Self> table{
      "data", config::Fingerprint::Never,
      {
          MCPP_FIELD(data_path)
              .flag("--data-path", "a dataset prefix, or a blend: WEIGHT PREFIX WEIGHT PREFIX ...")
              .repeatable(),
          MCPP_FIELD(train_data_path).flag("--train-data-path", split_help).repeatable(),
          MCPP_FIELD(valid_data_path).flag("--valid-data-path", split_help).repeatable(),
          MCPP_FIELD(test_data_path).flag("--test-data-path", split_help).repeatable(),
          MCPP_FIELD(split).flag("--split"),
          MCPP_FIELD(tokenizer_type)
              .flag("--tokenizer-type", "GPT2BPETokenizer|HuggingFaceTokenizer|SentencePieceTokenizer|NullTokenizer"),
          MCPP_FIELD(tokenizer_model)
              .flag("--tokenizer-model",
                    "HuggingFaceTokenizer: directory with tokenizer.json; SentencePieceTokenizer: tokenizer.model"),
          MCPP_FIELD(vocab_file).flag("--vocab-file"),
          MCPP_FIELD(merge_file).flag("--merge-file"),
          MCPP_FIELD(eod_mask_loss).store_true("--eod-mask-loss"),
          MCPP_FIELD(reset_position_ids)
              .store_true("--reset-position-ids", "positions restart after each EOD (packed documents)"),
          MCPP_FIELD(reset_attention_mask)
              .store_true("--reset-attention-mask", "documents (ended by EOD) attend only within themselves"),
          MCPP_FIELD(sft).store_true("--sft", "supervised fine-tuning: the data paths are JSONL conversations, packed"),
          MCPP_FIELD(sft_tokenizer_prompt_format).flag("--sft-tokenizer-prompt-format", sft_prompt_formats()),
      }};
  return table;
}

std::array<double, 3> DataConfig::split_fractions() const {
  char sep = split.find(',') != std::string::npos ? ',' : '/';
  std::vector<double> parts;
  size_t start = 0;
  while (true) {
    size_t end = split.find(sep, start);
    std::string tok = split.substr(start, end == std::string::npos ? std::string::npos : end - start);
    char* stop = nullptr;
    double v = std::strtod(tok.c_str(), &stop);
    if (tok.empty() || stop != tok.c_str() + tok.size() || !std::isfinite(v) || v < 0.0)
      fail("split: malformed '{}' (expected up to 3 non-negative weights like 969,30,1)", split);
    parts.push_back(v);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (parts.size() > 3) fail("split: malformed '{}' (more than 3 weights)", split);
  double sum = 0.0;
  for (double v : parts) sum += v;
  if (!(sum > 0.0)) fail("split: weights in '{}' sum to 0", split);
  std::array<double, 3> out{0.0, 0.0, 0.0};
  for (size_t i = 0; i < parts.size(); ++i) out[i] = parts[i] / sum;
  return out;
}

void DataConfig::validate() const {
  (void)split_fractions();
  const std::pair<const char*, const std::vector<std::string>*> paths[] = {
      {"data_path", &data_path}, {"train_data_path", &train_data_path}, {"valid_data_path", &valid_data_path},
      {"test_data_path", &test_data_path}};
  check_sft_prompt_format(sft_tokenizer_prompt_format);
  for (const auto& [field, path] : paths) {
    for (const auto& p : *path)
      if (p.empty()) fail("{}: empty path", field);
    if (sft && path->size() > 1)
      fail("{}: with --sft a split reads one JSONL file (got {} entries; blends are not supported)", field,
           path->size());
    if (!sft && !path->empty()) parse_data_blend(*path, field);  // a prefix, or 'weight prefix' pairs
  }
  if (!data_path.empty() && (!train_data_path.empty() || !valid_data_path.empty() || !test_data_path.empty()))
    fail("data_path and train_data_path / valid_data_path / test_data_path are both set; give one (Megatron: one "
         "blend split by --split, or one per split)");
  const bool with_model = tokenizer_type == "HuggingFaceTokenizer" || tokenizer_type == "SentencePieceTokenizer";
  if (!with_model && tokenizer_type != "GPT2BPETokenizer" && tokenizer_type != "NullTokenizer")
    fail("tokenizer_type: unknown value '{}' (expected GPT2BPETokenizer|HuggingFaceTokenizer|SentencePieceTokenizer|"
         "NullTokenizer)", tokenizer_type);
  if (with_model && tokenizer_model.empty())
    fail("tokenizer_model: --tokenizer-type {} needs --tokenizer-model", tokenizer_type);
  if (!with_model && !tokenizer_model.empty())
    fail("tokenizer_model: --tokenizer-model belongs to HuggingFaceTokenizer / SentencePieceTokenizer, not {}",
         tokenizer_type);
}

}  // namespace mcpp
